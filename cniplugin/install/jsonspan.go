package install

import (
	"bytes"
	"encoding/json"
	"errors"
)

// The conflist editor works on byte spans: a decode/encode round trip would reorder keys and
// reformat numbers and whitespace of other plugins. Spans keep every byte outside our entry, so
// removal restores the original file byte for byte.

// span is the half-open byte range [start, end) of one JSON value.
type span struct{ start, end int }

// member is one key/value pair of a JSON object.
type member struct {
	key string
	val span
}

// scanObject returns the members of the object starting at data[pos] and its braces' positions.
func scanObject(data []byte, pos int) (members []member, open, close int, err error) {
	open, close, err = scanItems(data, pos, '{', func(key string, val span) {
		members = append(members, member{key: key, val: val})
	})
	return members, open, close, err
}

// scanArray returns the elements of the array starting at data[pos] and its brackets' positions.
func scanArray(data []byte, pos int) (elems []span, open, close int, err error) {
	open, close, err = scanItems(data, pos, '[', func(_ string, val span) { elems = append(elems, val) })
	return elems, open, close, err
}

// scanItems calls item with the key (objects only) and value span of each member of the object
// (delim '{') or element of the array ('[') starting at data[pos], and returns the positions of
// its brackets. encoding/json's decoder finds them: a raw value is the exact bytes it ends with.
func scanItems(data []byte, pos int, delim json.Delim, item func(string, span)) (open, close int, err error) {
	dec := json.NewDecoder(bytes.NewReader(data[pos:]))
	at := func() int { return pos + int(dec.InputOffset()) }
	if tok, err := dec.Token(); err != nil || tok != delim {
		if delim == '[' {
			return 0, 0, errors.New("not a JSON array")
		}
		return 0, 0, errors.New("not a JSON object")
	}
	open = at() - 1
	for dec.More() {
		var key string
		if delim == '{' {
			tok, err := dec.Token()
			if err != nil {
				return 0, 0, err
			}
			key, _ = tok.(string)
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return 0, 0, err
		}
		item(key, span{at() - len(raw), at()})
	}
	if _, err := dec.Token(); err != nil {
		return 0, 0, err
	}
	return open, at() - 1, nil
}

// lookup returns the value span of key in members, the last if it repeats (as encoding/json does).
func lookup(members []member, key string) (span, bool) {
	for i := len(members) - 1; i >= 0; i-- {
		if members[i].key == key {
			return members[i].val, true
		}
	}
	return span{}, false
}

// splice returns a new slice: data with data[s.start:s.end] replaced by repl.
func splice(data []byte, s span, repl []byte) []byte {
	out := make([]byte, 0, len(data)-(s.end-s.start)+len(repl))
	out = append(out, data[:s.start]...)
	out = append(out, repl...)
	return append(out, data[s.end:]...)
}
