package install

import (
	"encoding/json"
	"errors"
	"fmt"
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

var errTruncated = errors.New("unexpected end of JSON")

func isWS(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// skipWS returns the first position at or after pos that is not JSON whitespace.
func skipWS(data []byte, pos int) int {
	for pos < len(data) && isWS(data[pos]) {
		pos++
	}
	return pos
}

// skipValue returns the end of the JSON value starting at data[pos]. The document must have passed
// json.Valid; the checks here only keep a bad caller from looping or panicking.
func skipValue(data []byte, pos int) (int, error) {
	if pos >= len(data) {
		return 0, errTruncated
	}
	switch data[pos] {
	case '"':
		return skipString(data, pos)
	case '{':
		_, _, end, err := scanObject(data, pos)
		return end + 1, err
	case '[':
		_, _, end, err := scanArray(data, pos)
		return end + 1, err
	default:
		// Number, true, false or null: runs until a delimiter.
		i := pos
		for i < len(data) && !isWS(data[i]) && data[i] != ',' && data[i] != '}' && data[i] != ']' {
			i++
		}
		if i == pos {
			return 0, fmt.Errorf("unexpected %q at offset %d", data[pos], pos)
		}
		return i, nil
	}
}

// skipString returns the end of the string literal starting at data[pos].
func skipString(data []byte, pos int) (int, error) {
	for i := pos + 1; i < len(data); i++ {
		switch data[i] {
		case '\\':
			i++
		case '"':
			return i + 1, nil
		}
	}
	return 0, errTruncated
}

// scanObject returns the members of the object starting at data[pos] and its braces' positions.
func scanObject(data []byte, pos int) (members []member, open, close int, err error) {
	open, close, err = scanItems(data, pos, "object", func(pos int) (int, error) {
		keyEnd, err := skipString(data, pos)
		if err != nil || data[pos] != '"' {
			return 0, fmt.Errorf("expected a key at offset %d", pos)
		}
		var key string
		if err := json.Unmarshal(data[pos:keyEnd], &key); err != nil {
			return 0, fmt.Errorf("key at offset %d: %w", pos, err)
		}
		pos = skipWS(data, keyEnd)
		if pos >= len(data) || data[pos] != ':' {
			return 0, fmt.Errorf("expected ':' at offset %d", pos)
		}
		pos = skipWS(data, pos+1)
		end, err := skipValue(data, pos)
		members = append(members, member{key: key, val: span{pos, end}})
		return end, err
	})
	return members, open, close, err
}

// scanArray returns the elements of the array starting at data[pos] and its brackets' positions.
func scanArray(data []byte, pos int) (elems []span, open, close int, err error) {
	open, close, err = scanItems(data, pos, "array", func(pos int) (int, error) {
		end, err := skipValue(data, pos)
		elems = append(elems, span{pos, end})
		return end, err
	})
	return elems, open, close, err
}

// scanItems calls item at the start of each member of the object (kind "object") or element of
// the array starting at data[pos]; item returns where that one ends. It returns the positions of
// the brackets.
func scanItems(data []byte, pos int, kind string, item func(int) (int, error)) (open, close int, err error) {
	openB, closeB := byte('{'), byte('}')
	if kind == "array" {
		openB, closeB = '[', ']'
	}
	pos = skipWS(data, pos)
	if pos >= len(data) || data[pos] != openB {
		return 0, 0, errors.New("not a JSON " + kind)
	}
	open = pos
	pos = skipWS(data, pos+1)
	if pos < len(data) && data[pos] == closeB {
		return open, pos, nil
	}
	for {
		end, err := item(pos)
		if err != nil {
			return 0, 0, err
		}
		pos = skipWS(data, end)
		if pos >= len(data) {
			return 0, 0, errTruncated
		}
		switch data[pos] {
		case ',':
			pos = skipWS(data, pos+1)
		case closeB:
			return open, pos, nil
		default:
			return 0, 0, fmt.Errorf("unexpected %q at offset %d", data[pos], pos)
		}
	}
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
