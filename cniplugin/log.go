package cniplugin

import (
	"io"
	"log/slog"
	"os"
)

// newLogger returns the logger of one plugin invocation: slog text lines on stderr at the
// configured level, also appended to logFile when it is set, each carrying the pod, namespace and
// container ID. The returned function closes the log file.
//
// The file is opened with O_APPEND and every record is written with one write call, so the lines
// of concurrent plugin processes interleave whole. A log file that cannot be opened is reported
// on stderr and otherwise ignored: logging must never fail an ADD.
func newLogger(stderr io.Writer, level slog.Level, logFile string, attrs ...any) (*slog.Logger, func()) {
	w := stderr
	closeFn := func() {}
	var openErr error
	if logFile != "" {
		f, err := os.OpenFile(logFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
		if err != nil {
			openErr = err
		} else {
			w = io.MultiWriter(stderr, f)
			closeFn = func() { _ = f.Close() }
		}
	}
	log := slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})).With(attrs...)
	if openErr != nil {
		log.Warn("cannot open log_file; logging to stderr only", "log_file", logFile, "error", openErr)
	}
	return log, closeFn
}
