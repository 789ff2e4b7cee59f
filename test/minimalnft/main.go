// Command minimalnft writes the chart-default table (the one `proxy-init --iptables-mode
// nftables` writes) with google/nftables and nothing else: no flags, no logging, no read-back,
// no checks. The benchmark runs it as the floor for any Go program that writes this table.
package main

import (
	"encoding/binary"
	"log"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

func port(p uint16) []byte { return binaryutil.BigEndian.PutUint16(p) }

func main() {
	c, err := nftables.New()
	if err != nil {
		log.Fatal(err)
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "proxy_init"})
	sets := map[string][][2]uint16{
		"inbound_ignore_ports":  {{4190, 4191}, {4567, 4568}},
		"outbound_ignore_ports": {{4567, 4568}},
	}
	added := map[string]*nftables.Set{}
	for name, ranges := range sets {
		s := &nftables.Set{Table: t, Name: name, KeyType: nftables.TypeInetService, Interval: true, Constant: true}
		var elems []nftables.SetElement
		for _, r := range ranges {
			elems = append(elems, nftables.SetElement{Key: port(r[0])}, nftables.SetElement{Key: port(r[1] + 1), IntervalEnd: true})
		}
		if err := c.AddSet(s, elems); err != nil {
			log.Fatal(err)
		}
		added[name] = s
	}
	tcp := []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}}}
	skip := func(set string) []expr.Any {
		return append(append([]expr.Any{}, tcp...),
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Lookup{SourceRegister: 1, SetName: set, SetID: added[set].ID},
			&expr.Verdict{Kind: expr.VerdictReturn})
	}
	redirect := func(p uint16) []expr.Any {
		return append(append([]expr.Any{}, tcp...),
			&expr.Immediate{Register: 1, Data: port(p)},
			&expr.Redir{RegisterProtoMin: 1, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED})
	}
	meta := func(key expr.MetaKey, data []byte) []expr.Any {
		return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: data},
			&expr.Verdict{Kind: expr.VerdictReturn}}
	}
	uid := make([]byte, 4)
	binary.NativeEndian.PutUint32(uid, 2102)
	lo := make([]byte, unix.IFNAMSIZ)
	copy(lo, "lo")
	prio := nftables.ChainPriorityNATDest
	in := c.AddChain(&nftables.Chain{Table: t, Name: "PROXY_INIT_REDIRECT", Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: prio})
	out := c.AddChain(&nftables.Chain{Table: t, Name: "PROXY_INIT_OUTPUT", Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookOutput, Priority: prio})
	for _, r := range []struct {
		ch *nftables.Chain
		e  []expr.Any
	}{
		{in, skip("inbound_ignore_ports")}, {in, redirect(4143)},
		{out, meta(expr.MetaKeySKUID, uid)}, {out, meta(expr.MetaKeyOIFNAME, lo)},
		{out, skip("outbound_ignore_ports")}, {out, redirect(4140)},
	} {
		c.AddRule(&nftables.Rule{Table: t, Chain: r.ch, Exprs: r.e})
	}
	if err := c.Flush(); err != nil {
		log.Fatal(err)
	}
}
