package install

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"time"
	"unicode/utf8"
)

// logPollInterval is how often the plugin's log file is checked for new lines. Polling, not
// inotify: a poll handles a file not there yet, replaced or truncated all the same way.
const logPollInterval = 200 * time.Millisecond

// maxPartialLine bounds the start of a line held until its newline: anything appending without
// newlines would otherwise grow the installer's memory up to its limit (and an OOM kill loop).
const maxPartialLine = 64 << 10

// cutMarker ends each maxPartialLine piece of a longer unfinished line.
const cutMarker = " [linkerd-cni: line cut at 64 KiB; it continues on the next line]\n"

// lineBuffer passes complete lines on to out and holds at most maxPartialLine bytes of an
// unfinished one.
type lineBuffer struct {
	out     io.Writer
	partial []byte
}

// Write passes every complete line so far to out, then cuts the unfinished rest into pieces of at
// most maxPartialLine bytes (not inside a UTF-8 sequence), each ended by cutMarker, until it fits.
func (l *lineBuffer) Write(b []byte) (int, error) {
	l.partial = append(l.partial, b...)
	if i := bytes.LastIndexByte(l.partial, '\n'); i >= 0 {
		_, _ = l.out.Write(l.partial[:i+1])
		l.partial = append(l.partial[:0], l.partial[i+1:]...)
	}
	for len(l.partial) > maxPartialLine {
		cut := maxPartialLine
		for back := 0; back < utf8.UTFMax-1 && !utf8.RuneStart(l.partial[cut]); back++ {
			cut--
		}
		_, _ = l.out.Write(append(l.partial[:cut:cut], cutMarker...))
		l.partial = append(l.partial[:0], l.partial[cut:]...)
	}
	return len(b), nil
}

// reset drops an unfinished line: its file was replaced or truncated.
func (l *lineBuffer) reset() { l.partial = l.partial[:0] }

// streamLog copies complete lines appended to path to out until ctx ends, like `tail -F -n0`:
// lines in the file at start are skipped (an earlier installer streamed them), a file created
// later is read from its start, a replaced or truncated file is followed. Once it has reached
// maxSize and is streamed to its end, it is renamed to path.1, so it cannot fill the node's disk.
func streamLog(ctx context.Context, path string, maxSize int64, out io.Writer, log *slog.Logger) {
	t := &logTail{path: path, maxSize: maxSize, lines: lineBuffer{out: out}, log: log, first: true,
		buf: make([]byte, 32*1024)}
	defer func() {
		if t.f != nil {
			t.f.Close()
		}
	}()
	tick := time.NewTicker(logPollInterval)
	defer tick.Stop()
	for {
		if t.f == nil {
			t.open()
		}
		if t.f != nil && t.follow() {
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// logTail is streamLog's state: the file it follows and how far it has read.
type logTail struct {
	path         string
	maxSize      int64
	log          *slog.Logger
	rotateFailed bool
	f            *os.File // nil until the file exists, and after it was replaced
	ino          fileID
	off          int64
	lines        lineBuffer
	first        bool // the first open skips what the file holds
	buf          []byte
}

// open opens the file, at its end the first time, at its start after that.
func (t *logTail) open() {
	nf, err := os.Open(t.path)
	switch {
	case err == nil:
		t.f = nf
		t.ino, _ = statID(t.path)
		t.off = 0
		if t.first {
			if end, err := t.f.Seek(0, io.SeekEnd); err == nil {
				t.off = end
			}
		}
		t.log.Info("streaming the plugin's log file", "path", t.path)
	case !errors.Is(err, fs.ErrNotExist):
		t.log.Warn("cannot open the plugin's log file", "path", t.path, "error", err)
	}
	t.first = false
}

// drain streams what the open file holds past the offset.
func (t *logTail) drain() {
	// The struct hides the file's WriteTo, which would take a new buffer each time.
	n, _ := io.CopyBuffer(&t.lines, struct{ io.Reader }{t.f}, t.buf)
	t.off += n
}

// follow streams the open file, then handles its replacement, truncation or rotation; true: again.
func (t *logTail) follow() bool {
	t.drain()
	cur, err := statID(t.path)
	switch {
	case err != nil || cur.ino != t.ino.ino:
		// Replaced or removed: finish the old file, then reopen.
		t.drain()
		t.f.Close()
		t.f = nil
		t.lines.reset()
		return true
	case cur.size < t.off:
		// Truncated: start over from the beginning.
		if _, err := t.f.Seek(0, io.SeekStart); err == nil {
			t.off = 0
			t.lines.reset()
		}
		return true
	case cur.size >= t.maxSize && t.off >= cur.size && !t.rotateFailed:
		// All streamed, and big: rotate. Plugin processes open the file anew on every call, so
		// the next one creates a fresh file; the next pass finishes the old one and follows.
		if err := os.Rename(t.path, t.path+".1"); err != nil {
			t.rotateFailed = true
			t.log.Warn("cannot rotate the plugin's log file; it will keep growing", "path", t.path, "error", err)
		} else {
			t.log.Info("rotated the plugin's log file", "path", t.path, "to", t.path+".1", "bytes", cur.size)
		}
		return true
	}
	return false
}
