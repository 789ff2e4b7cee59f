// Command demo is the small TCP helper behind `make demo` (hack/demo.sh): a fake sidecar proxy
// that tells each client where its connection was originally headed, a plain server, and a
// client that prints the one-line reply it gets.
//
//	demo proxy -ports 4140,4143 -admin 4191 -ready FILE   fake proxy on every port, IPv4 and IPv6
//	demo serve -addr :8080 -name app -ready FILE
//	demo dial 192.0.2.20:80
//	linkerd-await --timeout=2m --port=4191   (as argv[0]) wait until the admin port says ready
//
// With -admin, the fake proxy also answers HTTP on that port (/ready and /live, 200), as
// Linkerd's proxy does for its probes; invoked as linkerd-await it stands in for Linkerd's
// linkerd-await in a postStart hook. The end-to-end suite runs both at Linkerd's paths.
//
// The fake proxy reads the pre-NAT destination with SO_ORIGINAL_DST (IPv4) or
// IP6T_SO_ORIGINAL_DST (IPv6), exactly what Linkerd's proxy does to learn where a redirected
// connection was going. Limits: demo only; TCP only; it runs in whatever network namespace it is
// started in (the script uses `ip netns exec`) and never enters one itself.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kubemesh/proxy-init/internal/origdst"
)

func main() {
	if filepath.Base(os.Args[0]) == "linkerd-await" {
		if err := await(os.Args[1:]); err != nil {
			fmt.Fprintln(os.Stderr, "linkerd-await: "+err.Error())
			os.Exit(1)
		}
		return
	}
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: demo proxy|serve|dial ...")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "proxy":
		err = proxy(os.Args[2:])
	case "serve":
		err = serve(os.Args[2:])
	case "dial":
		err = dial(os.Args[2:])
	default:
		err = fmt.Errorf("unknown subcommand %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo: "+err.Error())
		os.Exit(1)
	}
}

// proxy answers every connection with where it landed and where it was headed.
func proxy(args []string) error {
	fs := flag.NewFlagSet("proxy", flag.ContinueOnError)
	ports := fs.String("ports", "4140,4143", "comma-separated ports")
	ready := fs.String("ready", "", "file to create once listening")
	admin := fs.Int("admin", 0, "also answer HTTP /ready and /live on this port (0: no)")
	forward := fs.Bool("forward", false, "relay outbound connections to their original destination and append its reply (run it as the exempt proxy user)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *admin != 0 {
		for _, network := range []string{"tcp4", "tcp6"} {
			ln, err := listen(network, *admin)
			if err != nil {
				return err
			}
			go func() {
				_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ready\n") }))
			}()
		}
	}
	var lns []net.Listener
	for _, p := range strings.Split(*ports, ",") {
		port, err := strconv.Atoi(p)
		if err != nil {
			return fmt.Errorf("bad port %q", p)
		}
		for _, network := range []string{"tcp4", "tcp6"} {
			ln, err := listen(network, port)
			if err != nil {
				return err
			}
			lns = append(lns, ln)
		}
	}
	for _, ln := range lns {
		go accept(ln, func(c *net.TCPConn) string {
			role := "outbound"
			if c.LocalAddr().(*net.TCPAddr).Port == 4143 {
				role = "inbound"
			}
			dst, err := origdst.Lookup(c)
			if err != nil {
				return fmt.Sprintf("fake proxy (%s port %d): connection from %s, original destination unknown (%v)",
					role, c.LocalAddr().(*net.TCPAddr).Port, c.RemoteAddr(), err)
			}
			reply := fmt.Sprintf("fake proxy (%s port %d): connection from %s, original destination %s",
				role, c.LocalAddr().(*net.TCPAddr).Port, c.RemoteAddr(), dst)
			if *forward && role == "outbound" {
				reply += "; forwarded: " + relay(dst.String())
			}
			return reply
		})
	}
	return waitReady(*ready)
}

// serve is an application or peer server that answers directly.
func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	port := fs.Int("port", 80, "port to listen on (IPv4 and IPv6)")
	name := fs.String("name", "server", "name to answer with")
	ready := fs.String("ready", "", "file to create once listening")
	if err := fs.Parse(args); err != nil {
		return err
	}
	for _, network := range []string{"tcp4", "tcp6"} {
		ln, err := listen(network, *port)
		if err != nil {
			return err
		}
		go accept(ln, func(c *net.TCPConn) string {
			return fmt.Sprintf("%s at %s answered directly (no proxy), connection from %s", *name, c.LocalAddr(), c.RemoteAddr())
		})
	}
	return waitReady(*ready)
}

// relay dials addr, as a proxy forwarding a connection would, and returns the line it answers.
func relay(addr string) string {
	c, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err != nil {
		return "unreachable (" + err.Error() + ")"
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil && line == "" {
		return "no answer (" + err.Error() + ")"
	}
	return strings.TrimSpace(line)
}

// await polls the admin port's /ready until it answers 200 or the timeout passes.
func await(args []string) error {
	fs := flag.NewFlagSet("linkerd-await", flag.ContinueOnError)
	timeout := fs.Duration("timeout", 2*time.Minute, "how long to wait")
	port := fs.Int("port", 4191, "the proxy's admin port")
	if err := fs.Parse(args); err != nil {
		return err
	}
	deadline := time.Now().Add(*timeout)
	for {
		resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(*port) + "/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("status %s", resp.Status)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("proxy not ready on port %d after %v: %w", *port, *timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func listen(network string, port int) (net.Listener, error) {
	host := "0.0.0.0"
	if network == "tcp6" {
		host = "::" // tcp6 sets IPV6_V6ONLY, so IPv4 clients never show up as v4-mapped
	}
	ln, err := net.Listen(network, net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	return ln, nil
}

func accept(ln net.Listener, reply func(*net.TCPConn) string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
			fmt.Fprintln(c, reply(c.(*net.TCPConn)))
		}()
	}
}

// waitReady signals readiness, then serves until killed.
func waitReady(file string) error {
	if file != "" {
		if err := os.WriteFile(file, nil, 0o644); err != nil {
			return fmt.Errorf("write ready file: %w", err)
		}
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	<-sig
	return nil
}

// dial connects, prints the reply and exits non-zero if nothing answered.
func dial(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: demo dial HOST:PORT")
	}
	c, err := net.DialTimeout("tcp", args[0], 3*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	b, err := io.ReadAll(io.LimitReader(c, 4096))
	if err != nil {
		return fmt.Errorf("read reply: %w", err)
	}
	if len(b) == 0 {
		return fmt.Errorf("connected to %s but got no reply", args[0])
	}
	fmt.Print(string(b))
	return nil
}
