package origdst_test

import (
	"net"
	"testing"

	"github.com/kubemesh/proxy-init/internal/origdst"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
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
	listen := func(network, addr string) net.Listener {
		var ln net.Listener
		if err := n.Do(func() (err error) {
			ln, err = net.Listen(network, addr)
			return err
		}); err != nil {
			t.Fatalf("listen %s %s: %v", network, addr, err)
		}
		t.Cleanup(func() { _ = ln.Close() })
		return ln
	}
	dualStack := listen("tcp", "[::]:4140")
	v4Only := listen("tcp4", "0.0.0.0:4141")
	plain := listen("tcp4", "127.0.0.1:4142") // no rule sends anything here

	tests := []struct {
		name          string
		ln            net.Listener
		network, addr string
		want          string
	}{
		{"ipv4 client, dual-stack listener", dualStack, "tcp4", "127.0.0.2:80", "127.0.0.2:80"},
		{"ipv6 client, dual-stack listener", dualStack, "tcp6", "[::1]:80", "[::1]:80"},
		{"ipv4 client, ipv4 listener", v4Only, "tcp4", "127.0.0.3:81", "127.0.0.3:81"},
		// conntrack saw the connection (a nat chain exists) but changed nothing.
		{"not redirected", plain, "tcp4", "127.0.0.1:4142", "127.0.0.1:4142"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// The kernel completes the handshake into the backlog, so the client can connect
			// before the server accepts.
			var client net.Conn
			if err := n.Do(func() (err error) {
				client, err = net.Dial(tc.network, tc.addr)
				return err
			}); err != nil {
				t.Fatalf("dial %s %s: %v", tc.network, tc.addr, err)
			}
			defer client.Close()
			c, err := tc.ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if c.RemoteAddr().(*net.TCPAddr).Port != client.LocalAddr().(*net.TCPAddr).Port {
				t.Fatalf("accepted %s, want the connection from %s", c.RemoteAddr(), client.LocalAddr())
			}
			got, err := origdst.Lookup(c.(*net.TCPConn))
			if err != nil || got.String() != tc.want {
				t.Fatalf("Lookup = %v, %v; want %s", got, err, tc.want)
			}
		})
	}
}
