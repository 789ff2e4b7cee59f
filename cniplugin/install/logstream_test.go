package install

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestLineBufferBoundsUnfinishedLines: complete lines pass as they are; an unfinished line holds
// at most maxPartialLine bytes, the longer start going out in marked pieces, and nothing of the
// text is lost or reordered.
func TestLineBufferBoundsUnfinishedLines(t *testing.T) {
	long := strings.Repeat("x", 3*maxPartialLine+100)
	// é is two bytes: the 64 KiB boundary falls inside one, which must not be split.
	accented := strings.Repeat("a", maxPartialLine-1) + strings.Repeat("é", 10)
	tests := []struct {
		name   string
		writes []string
		// want is what out holds after the writes; held what the buffer still holds.
		want, held string
	}{
		{"complete lines", []string{"one\ntwo\n"}, "one\ntwo\n", ""},
		{"a line in pieces", []string{"par", "tial\nnext"}, "partial\n", "next"},
		{"exactly the bound is held", []string{strings.Repeat("y", maxPartialLine)}, "", strings.Repeat("y", maxPartialLine)},
		{"a line with no end is cut", []string{long},
			strings.Repeat(strings.Repeat("x", maxPartialLine)+cutMarker, 3), strings.Repeat("x", 100)},
		{"its end arrives later", []string{long, "end\n"},
			strings.Repeat(strings.Repeat("x", maxPartialLine)+cutMarker, 3) + strings.Repeat("x", 100) + "end\n", ""},
		// The newline comes in the write that takes the line past its third 64 KiB: a line
		// complete in what is held passes whole.
		{"in small writes", chunks(long+"\n", 1000),
			strings.Repeat(strings.Repeat("x", maxPartialLine)+cutMarker, 2) + strings.Repeat("x", maxPartialLine+100) + "\n", ""},
		{"not inside a UTF-8 sequence", []string{accented},
			strings.Repeat("a", maxPartialLine-1) + cutMarker, strings.Repeat("é", 10)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			l := lineBuffer{out: &out}
			for _, w := range tt.writes {
				l.Write([]byte(w))
				if len(l.partial) > maxPartialLine {
					t.Fatalf("holds %d bytes of an unfinished line, more than %d", len(l.partial), maxPartialLine)
				}
			}
			if got := out.String(); got != tt.want {
				t.Errorf("out = %s, want %s", summary(got), summary(tt.want))
			}
			if got := string(l.partial); got != tt.held {
				t.Errorf("held = %s, want %s", summary(got), summary(tt.held))
			}
			if !utf8.Valid(out.Bytes()) {
				t.Error("out is not valid UTF-8: a piece was cut inside a character")
			}
		})
	}
}

func chunks(s string, n int) []string {
	var c []string
	for len(s) > n {
		c, s = append(c, s[:n]), s[n:]
	}
	return append(c, s)
}

// summary keeps a failure message short: long runs of text are shown by their length.
func summary(s string) string {
	if len(s) < 200 {
		return strings.ReplaceAll(s, "\n", `\n`)
	}
	return strings.ReplaceAll(s[:60], "\n", `\n`) + "…(" + strconv.Itoa(len(s)) + " bytes)…" + strings.ReplaceAll(s[len(s)-80:], "\n", `\n`)
}
