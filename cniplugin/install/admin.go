package install

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// serveAdmin serves /live and /ready on cfg.AdminAddr; the returned func stops it.
func (in *installer) serveAdmin() (func(), error) {
	ln, err := net.Listen("tcp", in.cfg.AdminAddr)
	if err != nil {
		return nil, fmt.Errorf("admin server: %w", err)
	}
	if in.cfg.onAdminListen != nil {
		in.cfg.onAdminListen(ln.Addr())
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/live", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("/ready", func(w http.ResponseWriter, _ *http.Request) {
		if ok, reason := in.readiness(); !ok {
			http.Error(w, "not ready: "+reason, http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ready\n")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			in.log.Error("admin server stopped", "error", err)
		}
	}()
	in.log.Info("serving /ready and /live", "addr", ln.Addr().String())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}
