package install

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// listDoc locates a configuration list's "plugins" array and each plugin, with its type.
type listDoc struct {
	open  int // the bracket of "plugins"
	elems []span
	types []string
}

// topMembers returns the members of data's top-level object, if data is valid JSON.
func topMembers(data []byte) ([]member, error) {
	// Unmarshal checks the whole document before it decodes anything.
	if err := json.Unmarshal(data, new(json.RawMessage)); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, fmt.Errorf("invalid JSON at offset %d: %w", se.Offset, err)
		}
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	members, _, _, err := scanObject(data, 0)
	return members, err
}

// pluginType returns the "type" of a plugin object, or "" when it has none.
func pluginType(raw []byte) string {
	var p struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return ""
	}
	return p.Type
}

// parseList locates the plugins of a network configuration list.
func parseList(data []byte) (*listDoc, error) {
	members, err := topMembers(data)
	if err != nil {
		return nil, err
	}
	ps, ok := lookup(members, "plugins")
	if !ok {
		return nil, errors.New(`no "plugins" list`)
	}
	elems, open, _, err := scanArray(data, ps.start)
	if err != nil {
		return nil, fmt.Errorf(`"plugins": %w`, err)
	}
	doc := &listDoc{open: open, elems: elems}
	for i, e := range elems {
		if data[e.start] != '{' {
			return nil, fmt.Errorf("plugins[%d] is not an object", i)
		}
		doc.types = append(doc.types, pluginType(data[e.start:e.end]))
	}
	return doc, nil
}

// isList reports whether data is a JSON object with a "plugins" key, whatever its file's name.
func isList(data []byte) bool {
	members, err := topMembers(data)
	_, ok := lookup(members, "plugins")
	return err == nil && ok
}

// removeEntries returns data without any plugin of type typ, and how many it removed.
func removeEntries(data []byte, typ string) ([]byte, int, error) {
	removed := 0
	for {
		doc, err := parseList(data)
		if err != nil {
			return nil, 0, err
		}
		i := slices.Index(doc.types, typ)
		if i < 0 {
			return data, removed, nil
		}
		// plugins[i] goes with the comma and whitespace joining it to its predecessor (exactly
		// what appendEntry inserted), or to its successor when it is first.
		s := doc.elems[i]
		if i > 0 {
			s.start = doc.elems[i-1].end
		} else if len(doc.elems) > 1 {
			s.end = doc.elems[1].start
		}
		data = splice(data, s, nil)
		removed++
	}
}

// appendEntry returns data with entry as the last plugin, indented like the one before it; an old
// entry of type typ is replaced, never duplicated.
func appendEntry(data []byte, typ string, entry []byte) ([]byte, error) {
	data, _, err := removeEntries(data, typ)
	if err != nil {
		return nil, err
	}
	doc, err := parseList(data)
	if err != nil {
		return nil, err
	}
	n := len(doc.elems)
	if n == 0 {
		return splice(data, span{doc.open + 1, doc.open + 1}, entry), nil
	}
	last := doc.elems[n-1]
	// sep: the whitespace before the last plugin, after its comma or the bracket.
	sepStart := doc.open + 1
	if n > 1 {
		sepStart = doc.elems[n-2].end + bytes.IndexByte(data[doc.elems[n-2].end:last.start], ',') + 1
	}
	sep := data[sepStart:last.start]
	ins := slices.Concat([]byte{','}, sep, indentLike(entry, sep))
	return splice(data, span{last.end, last.end}, ins), nil
}

// indentLike formats a compact entry to follow sep: on its line, or indented at sep's column.
func indentLike(entry, sep []byte) []byte {
	nl := bytes.LastIndexByte(sep, '\n')
	if nl < 0 {
		return entry
	}
	prefix := string(sep[nl+1:])
	unit := "  "
	if strings.HasPrefix(prefix, "\t") {
		unit = "\t"
	}
	var b bytes.Buffer
	if err := json.Indent(&b, entry, prefix, unit); err != nil {
		return entry
	}
	return b.Bytes()
}

// convertConf turns a single-plugin .conf into a list of it (whitespace aside) and entry, with the
// .conf's cniVersion and name (else name).
func convertConf(data []byte, typ string, entry []byte, name string) ([]byte, error) {
	members, err := topMembers(data)
	if err != nil {
		return nil, err
	}
	t, ok := lookup(members, "type")
	if !ok || data[t.start] != '"' {
		return nil, errors.New(`no "type" string: not a plugin configuration`)
	}
	if got := pluginType(data); got == typ {
		return nil, fmt.Errorf("it configures %s itself; refusing to chain %s after it", typ, typ)
	}
	var b bytes.Buffer
	b.WriteString("{\n")
	if v, ok := lookup(members, "cniVersion"); ok {
		fmt.Fprintf(&b, "  \"cniVersion\": %s,\n", data[v.start:v.end])
	}
	nameJSON, _ := json.Marshal(name)
	if v, ok := lookup(members, "name"); ok {
		nameJSON = data[v.start:v.end]
	}
	fmt.Fprintf(&b, "  \"name\": %s,\n", nameJSON)
	b.WriteString("  \"plugins\": [\n    ")
	// json.Indent changes only whitespace between tokens, never keys, order, numbers or strings.
	if err := json.Indent(&b, bytes.TrimSpace(data), "    ", "  "); err != nil {
		return nil, err
	}
	b.WriteString("\n  ]\n}\n")
	return appendEntry(b.Bytes(), typ, entry)
}

// sameJSONText reports whether a and b differ at most in whitespace between tokens.
func sameJSONText(a, b []byte) bool {
	var ca, cb bytes.Buffer
	return json.Compact(&ca, a) == nil && json.Compact(&cb, b) == nil && bytes.Equal(ca.Bytes(), cb.Bytes())
}

// soleOtherPlugin returns the only plugin of a list not of type typ, or false.
func soleOtherPlugin(data []byte, typ string) ([]byte, bool) {
	doc, err := parseList(data)
	if err != nil {
		return nil, false
	}
	other := func(t string) bool { return t != typ }
	i := slices.IndexFunc(doc.types, other)
	if i < 0 || slices.ContainsFunc(doc.types[i+1:], other) {
		return nil, false
	}
	return data[doc.elems[i].start:doc.elems[i].end], true
}

// hasEntry reports whether the list holds a plugin of type typ.
func hasEntry(data []byte, typ string) bool {
	doc, err := parseList(data)
	return err == nil && slices.Contains(doc.types, typ)
}
