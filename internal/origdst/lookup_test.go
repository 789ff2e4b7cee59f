package origdst_test

import (
	"fmt"
	"net"
	"testing"

	nt "github.com/kubemesh/proxy-init/internal/netnstest"
	"github.com/kubemesh/proxy-init/internal/origdst"
)

// lookupNft redirects loopback connections to ports 80 and 81 to 4140 and 4141, in both families.
const lookupNft = `table inet origdsttest {
	chain output {
		type nat hook output priority -100; policy accept;
		tcp dport 80 redirect to :4140
		tcp dport 81 redirect to :4141
	}
}
`

// TestLookup redirects real connections in a throwaway namespace and checks what Lookup reports
// on each kind of listener: a dual-stack one (IPv4 clients arrive v4-mapped and must be asked at
// the IPv4 level), an IPv4-only one, and for an IPv6 client. A connection no rule redirected
// reports where it landed.
func TestLookup(t *testing.T) {
	nt.RequireRoot(t)
	n := nt.NewNS(t)
	if _, err := nt.RunInWithInput(t, n, lookupNft, "nft", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	listen := func(network, addr string) {
		var ln net.Listener
		if err := n.Do(func() (err error) {
			ln, err = net.Listen(network, addr)
			return err
		}); err != nil {
			t.Fatalf("listen %s %s: %v", network, addr, err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				c, err := ln.Accept()
				if err != nil {
					return // closed at cleanup
				}
				dst, err := origdst.Lookup(c.(*net.TCPConn))
				if err != nil {
					fmt.Fprintf(c, "error %v\n", err)
				} else {
					fmt.Fprintf(c, "%s\n", dst)
				}
				_ = c.Close()
			}
		}()
		t.Cleanup(func() {
			_ = ln.Close()
			<-done
		})
	}
	listen("tcp", "[::]:4140") // dual-stack
	listen("tcp4", "0.0.0.0:4141")
	listen("tcp4", "127.0.0.1:4142") // no rule sends anything here

	tests := []struct {
		network, addr, want string
	}{
		{"tcp4", "127.0.0.2:80", "127.0.0.2:80"},
		{"tcp6", "[::1]:80", "[::1]:80"},
		{"tcp4", "127.0.0.3:81", "127.0.0.3:81"},
	}
	for _, tc := range tests {
		t.Run(tc.network+" "+tc.addr, func(t *testing.T) {
			got, err := nt.Dial(t, n, tc.network, tc.addr, nt.DialOpts{})
			if err != nil || got != tc.want {
				t.Fatalf("original destination = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	t.Run("not redirected", func(t *testing.T) {
		got, err := nt.Dial(t, n, "tcp4", "127.0.0.1:4142", nt.DialOpts{})
		if err != nil {
			t.Fatal(err)
		}
		// conntrack saw the connection (a nat chain exists) but changed nothing, so the
		// original destination is where it landed.
		if got != "127.0.0.1:4142" {
			t.Fatalf("original destination of an unredirected connection = %q, want 127.0.0.1:4142", got)
		}
	})
}
