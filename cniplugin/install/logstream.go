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

// logPollInterval is how often the plugin's log file is checked for new
// lines. Polling, not inotify: the file may not exist yet, and may be
// replaced or truncated, and a poll handles all of that the same way.
const logPollInterval = 200 * time.Millisecond

// maxPartialLine bounds the start of a line held while its newline has not come: a plugin
// process killed mid-line, or anything else that appends to the file without newlines, would
// otherwise grow the installer's memory up to its limit (the kubelet then kills it in a loop).
// The plugin's own lines are a few hundred bytes.
const maxPartialLine = 64 << 10

// cutMarker ends each maxPartialLine piece of a longer line written before its end arrived; the
// rest of the line follows on the next one.
const cutMarker = " [linkerd-cni: line cut at 64 KiB; it continues on the next line]\n"

// lineBuffer passes complete lines on and holds at most maxPartialLine bytes of an unfinished one.
type lineBuffer struct {
	partial []byte
}

// write passes every complete line of what has come so far with b to out, then cuts the
// unfinished rest into pieces of at most maxPartialLine bytes (not inside a UTF-8 sequence),
// each ended by cutMarker, until what it holds fits the bound.
func (l *lineBuffer) write(out io.Writer, b []byte) {
	l.partial = append(l.partial, b...)
	if i := bytes.LastIndexByte(l.partial, '\n'); i >= 0 {
		_, _ = out.Write(l.partial[:i+1])
		l.partial = append(l.partial[:0], l.partial[i+1:]...)
	}
	for len(l.partial) > maxPartialLine {
		cut := maxPartialLine
		for back := 0; back < utf8.UTFMax-1 && !utf8.RuneStart(l.partial[cut]); back++ {
			cut--
		}
		_, _ = out.Write(append(l.partial[:cut:cut], cutMarker...))
		l.partial = append(l.partial[:0], l.partial[cut:]...)
	}
}

// reset drops an unfinished line: its file was replaced or truncated.
func (l *lineBuffer) reset() { l.partial = l.partial[:0] }

// streamLog copies complete lines appended to path to out until ctx ends,
// like `tail -F -n0`: lines already in the file at start are skipped (they
// were streamed by an earlier installer), a file created later is read
// from its start, and a replaced or truncated file is followed. Once the file
// has reached maxSize and is streamed to its end, it is renamed to path.1
// (replacing the previous one), so it cannot fill the node's disk. An unfinished line is held up
// to maxPartialLine bytes, then passed on in pieces (lineBuffer).
func streamLog(ctx context.Context, path string, maxSize int64, out io.Writer, log *slog.Logger) {
	var (
		rotateFailed bool
		f            *os.File
		ino          fileID
		off          int64
		lines        lineBuffer
		first        = true
		buf          = make([]byte, 32*1024)
	)
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	drain := func() {
		for {
			n, err := f.Read(buf)
			if n > 0 {
				off += int64(n)
				lines.write(out, buf[:n])
			}
			if err != nil || n == 0 {
				return
			}
		}
	}
	tick := time.NewTicker(logPollInterval)
	defer tick.Stop()
	for {
		if f == nil {
			nf, err := os.Open(path)
			switch {
			case err == nil:
				f = nf
				ino, _ = statID(path)
				off = 0
				if first {
					if end, err := f.Seek(0, io.SeekEnd); err == nil {
						off = end
					}
				}
				log.Info("streaming the plugin's log file", "path", path)
			case !errors.Is(err, fs.ErrNotExist):
				log.Warn("cannot open the plugin's log file", "path", path, "error", err)
			}
			first = false
		}
		if f != nil {
			drain()
			cur, err := statID(path)
			switch {
			case err != nil || cur.ino != ino.ino:
				// Replaced or removed: finish the old file, then reopen.
				drain()
				f.Close()
				f = nil
				lines.reset()
				continue
			case cur.size < off:
				// Truncated: start over from the beginning.
				if _, err := f.Seek(0, io.SeekStart); err == nil {
					off = 0
					lines.reset()
				}
				continue
			case cur.size >= maxSize && off >= cur.size && !rotateFailed:
				// All streamed, and big: keep the node's disk bounded, with one old generation
				// beside it. Plugin processes open the file anew on every call, so the next one
				// creates a fresh file; the next pass finishes the old one and follows.
				if err := os.Rename(path, path+".1"); err != nil {
					rotateFailed = true
					log.Warn("cannot rotate the plugin's log file; it will keep growing", "path", path, "error", err)
				} else {
					log.Info("rotated the plugin's log file", "path", path, "to", path+".1", "bytes", cur.size)
				}
				continue
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
