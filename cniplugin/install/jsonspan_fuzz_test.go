package install

import (
	"bytes"
	"encoding/json"
	"testing"
)

// The span scanner against encoding/json, on any valid JSON object: every member's key and
// value span (the last one of a repeated key) decode to what encoding/json decodes, and an array's element spans likewise.
// Replacing each value by itself through splice gives the input back byte for byte, and adding
// then removing our plugin in a list restores it exactly: the properties conflist editing rests on.
func FuzzJSONSpans(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"a":1}`, ` { "a" : [1, {"b":"x\"}"}] , "c":null } `, `{"plugins":[{"type":"bridge"},{"type":"portmap"}]}`,
		`{"plugins":[]}`, `{"s":"\u00e9\\","n":-1.5e3,"t":true,"plugins":[ {"type":"x","k":{"l":[]}} ]}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, doc string) {
		data := []byte(doc)
		var want map[string]json.RawMessage
		if !json.Valid(data) || json.Unmarshal(data, &want) != nil || want == nil {
			return
		}
		members, open, closeAt, err := scanObject(data, 0)
		if err != nil {
			t.Fatalf("scanObject(%q): %v", doc, err)
		}
		if data[open] != '{' || data[closeAt] != '}' {
			t.Fatalf("scanObject(%q): brackets at %d and %d", doc, open, closeAt)
		}
		for _, m := range members {
			if last, _ := lookup(members, m.key); last != m.val {
				continue // a repeated key: encoding/json, like lookup, keeps the last
			}
			w, ok := want[m.key]
			if !ok {
				t.Fatalf("scanObject(%q) found key %q that encoding/json does not", doc, m.key)
			}
			if !sameJSONText(data[m.val.start:m.val.end], w) {
				t.Fatalf("scanObject(%q): %q spans %q, encoding/json has %q", doc, m.key, data[m.val.start:m.val.end], w)
			}
			if !bytes.Equal(splice(data, m.val, data[m.val.start:m.val.end]), data) {
				t.Fatalf("splicing %q's value into itself changed %q", m.key, doc)
			}
			if data[m.val.start] == '[' {
				var items []json.RawMessage
				if err := json.Unmarshal(w, &items); err != nil {
					t.Fatal(err)
				}
				elems, _, _, err := scanArray(data, m.val.start)
				if err != nil || len(elems) != len(items) {
					t.Fatalf("scanArray of %q in %q: %d elements, %v; want %d", m.key, doc, len(elems), err, len(items))
				}
				for i, e := range elems {
					if !sameJSONText(data[e.start:e.end], items[i]) {
						t.Fatalf("scanArray of %q in %q: element %d is %q, want %q", m.key, doc, i, data[e.start:e.end], items[i])
					}
				}
			}
		}
		if _, err := parseList(data); err != nil || hasEntry(data, "linkerd-cni") {
			return
		}
		added, err := appendEntry(data, "linkerd-cni", []byte(`{"type":"linkerd-cni"}`))
		if err != nil {
			t.Fatalf("appendEntry(%q): %v", doc, err)
		}
		back, n, err := removeEntries(added, "linkerd-cni")
		if err != nil || n != 1 || !bytes.Equal(back, data) {
			t.Fatalf("add then remove of %q gave %q (%d removed, %v)", doc, back, n, err)
		}
	})
}
