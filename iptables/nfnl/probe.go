package nfnl

// The kernel probe: whether the kernel can run TPROXY. A batch sent without its end marker is
// checked message by message, loading what each needs, and then applied not at all (what `nft
// --check` does). Its rules hold iptables' TPROXY target (through nft_compat, which looks it up
// in x_tables, where iptables-legacy finds it too) and nftables' tproxy expression.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/mdlayher/netlink"

	"github.com/kubemesh/proxy-init/iptables"
)

// TPROXYSupport is what the kernel said about TPROXY.
type TPROXYSupport struct {
	// XT is iptables' TPROXY target (xt_TPROXY, CONFIG_NETFILTER_XT_TARGET_TPROXY), for the
	// iptables backends, legacy or nft; XTErr is why not.
	XT    bool
	XTErr error
	// Native is nftables' tproxy expression (nft_tproxy, CONFIG_NFT_TPROXY); NativeErr is why not.
	Native    bool
	NativeErr error
}

// The probe's objects, never created: a chain in the mangle table (the only table the TPROXY
// target accepts), a table of its own for the native expression.
const (
	probeChain = "PROXY_INIT_PROBE"
	probeTable = "proxy_init_probe"
)

// ProbeTPROXY asks the kernel of the calling thread's network namespace whether it can run
// TPROXY, and changes nothing. An error means the question could not be asked (no nf_tables
// netlink, no privilege), not that the answer is no.
func ProbeTPROXY(ctx context.Context) (TPROXYSupport, error) {
	var out TPROXYSupport
	c, err := dial(ctx)
	if err != nil {
		return out, err
	}
	defer c.close()

	b := newBatch(emptyState(""))
	addTable(b, famIP, iptables.TableMangle.Name)
	addChain(b, famIP, iptables.TableMangle.Name, probeChain)
	xtRule := len(b.what)
	addXT(b, iptables.IPv4, &iptables.XTRule{Table: iptables.TableMangle.Name, Chain: probeChain, TCP: true, Comment: iptables.CommentPrefix + "probe",
		Target: iptables.TargetTPROXY, ToPort: 1, OnIP: netip.IPv4Unspecified(), Mark: iptables.TPROXYMark})

	addTable(b, famInet, probeTable)
	addChain(b, famInet, probeTable, probeChain)
	exprs, err := nativeExprs(iptables.NFTRule{Matches: []iptables.NFTMatch{{Kind: iptables.NFTMatchTCP}}, Verdict: iptables.NFTTPROXY,
		RedirectPort: 1, Mark: iptables.TPROXYMark}, nil)
	if err != nil {
		return out, err
	}
	nativeRule := len(b.what)
	b.beginRule(famInet, probeTable, probeChain, exprs)
	b.add(what{text: "add rule inet " + probeTable + " " + probeChain + " meta l4proto tcp tproxy to :1"})

	refused, err := c.dryRun(b)
	if err != nil {
		return out, err
	}
	// A refused table or chain refuses what is in it too; only the rules' own answers tell.
	for i, e := range refused {
		if i < xtRule || i > nativeRule {
			return out, fmt.Errorf("probe TPROXY support: %w", e)
		}
	}
	out.XTErr, out.NativeErr = refused[xtRule], refused[nativeRule]
	out.XT, out.Native = out.XTErr == nil, out.NativeErr == nil
	return out, nil
}

// dryRun sends the batch without its end marker, and returns the kernel's refusals by message
// index (from 0). The kernel checks every message, answers each refused one and the last (which
// asks for it), and aborts: nothing is applied.
func (c *conn) dryRun(b *Batch) (map[int]error, error) {
	if b.err != nil {
		return nil, b.err
	}
	b.ackLast()
	if err := c.send(b.b); err != nil {
		return nil, fmt.Errorf("send the nf_tables probe: %w", err)
	}
	refused := map[int]error{}
	var whole error // the begin marker refused
	err := c.answers(len(b.what), func(oe *netlink.OpError) bool {
		if oe.Sequence < firstSeq {
			whole = oe
			return true
		}
		refused[int(oe.Sequence)-firstSeq] = oe.Err
		return false
	})
	if err = errors.Join(err, whole); err != nil {
		return nil, err
	}
	return refused, nil
}
