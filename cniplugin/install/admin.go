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

// serveAdmin serves /live (the process is up) and /ready (linkerd-cni is in
// every CNI config file) on cfg.AdminAddr. The returned func stops it.
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
		ok, reason := in.readiness()
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, "not ready: "+reason+"\n")
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
