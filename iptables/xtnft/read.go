package xtnft

// The read side: the ruleset generation and the table list in one round trip, and, only when a
// nat table exists, the chains and that table's rules.

import (
	"fmt"

	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/iptables"
)

// state is what one read found.
type state struct {
	genID uint32
	// native is set when the nftables backend's table exists.
	native bool
	// nat holds the nat tables that exist, by family (ip, ip6).
	nat map[byte]*natTable
}

type natTable struct {
	chains []chain // in the kernel's order
	rules  map[string][]rule
}

type chain struct {
	name string
	base bool
	hook uint32
}

func (t *natTable) chain(name string) *chain {
	for i := range t.chains {
		if t.chains[i].name == name {
			return &t.chains[i]
		}
	}
	return nil
}

// rule is one rule read back.
type rule struct {
	handle uint64
	exprs  []expr.Any
	// foreign names an expression this package does not read, which makes the rule not ours.
	foreign string
}

// read returns the state of the nat tables of both families.
func read(c *conn) (*state, error) {
	s := &state{nat: map[byte]*natTable{}}
	var m msgs
	m.beginNFT(unix.NFT_MSG_GETGEN, unix.NLM_F_REQUEST, unix.AF_UNSPEC)
	m.end("")
	m.beginNFT(unix.NFT_MSG_GETTABLE, unix.NLM_F_REQUEST|unix.NLM_F_DUMP, unix.AF_UNSPEC)
	m.end("")
	tables, err := c.dump(m.b, m.seq, func(a message) error {
		switch {
		case a.typ == unix.NLMSG_ERROR && a.errno != 0:
			return a.errno
		case a.typ == unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWGEN:
			ad, err := attrs(a.data)
			if err != nil {
				return err
			}
			for ad.Next() {
				if ad.Type() == unix.NFTA_GEN_ID {
					s.genID = ad.Uint32()
				}
			}
			return ad.Err()
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list nf_tables tables: %w", err)
	}
	for _, t := range tables {
		name, err := stringAttr(t.data, unix.NFTA_TABLE_NAME)
		if err != nil {
			return nil, fmt.Errorf("decode table: %w", err)
		}
		switch {
		case name == iptables.Table && (t.family == unix.NFPROTO_IPV4 || t.family == unix.NFPROTO_IPV6):
			s.nat[t.family] = &natTable{rules: map[string][]rule{}}
		case name == nativeTable && t.family == nativeFamily:
			s.native = true
		}
	}
	if len(s.nat) == 0 {
		return s, nil
	}

	m = msgs{}
	m.beginNFT(unix.NFT_MSG_GETCHAIN, unix.NLM_F_REQUEST|unix.NLM_F_DUMP, unix.AF_UNSPEC)
	m.end("")
	chains, err := c.dump(m.b, m.seq, ignore)
	if err != nil {
		return nil, fmt.Errorf("list nf_tables chains: %w", err)
	}
	for _, msg := range chains {
		t := s.nat[msg.family]
		if t == nil {
			continue
		}
		ch, table, err := parseChain(msg.data)
		if err != nil {
			return nil, fmt.Errorf("decode chain: %w", err)
		}
		if table == iptables.Table {
			t.chains = append(t.chains, ch)
		}
	}

	// One dump per family: given a table name, the kernel stops after the first table of that
	// name, whatever the family.
	for fam, t := range s.nat {
		m = msgs{}
		m.beginNFT(unix.NFT_MSG_GETRULE, unix.NLM_F_REQUEST|unix.NLM_F_DUMP, fam)
		m.str(unix.NFTA_RULE_TABLE, iptables.Table)
		m.end("")
		rules, err := c.dump(m.b, m.seq, ignore)
		if err != nil {
			return nil, fmt.Errorf("list the rules of table %s %s: %w", famName(fam), iptables.Table, err)
		}
		for _, msg := range rules {
			r, table, chain, err := parseRule(fam, msg.data)
			if err != nil {
				return nil, fmt.Errorf("decode rule: %w", err)
			}
			if msg.family == fam && table == iptables.Table {
				t.rules[chain] = append(t.rules[chain], r)
			}
		}
	}
	return s, nil
}

func ignore(message) error { return nil }

func stringAttr(data []byte, typ uint16) (string, error) {
	ad, err := attrs(data)
	if err != nil {
		return "", err
	}
	var s string
	for ad.Next() {
		if ad.Type() == typ {
			s = ad.String()
		}
	}
	return s, ad.Err()
}

func parseChain(data []byte) (chain, string, error) {
	ad, err := attrs(data)
	if err != nil {
		return chain{}, "", err
	}
	var c chain
	var table string
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_CHAIN_TABLE:
			table = ad.String()
		case unix.NFTA_CHAIN_NAME:
			c.name = ad.String()
		case unix.NFTA_CHAIN_HOOK:
			c.base = true
			ad.Nested(func(nd *netlinkDecoder) error {
				for nd.Next() {
					if nd.Type() == unix.NFTA_HOOK_HOOKNUM {
						c.hook = nd.Uint32()
					}
				}
				return nil
			})
		}
	}
	return c, table, ad.Err()
}

func parseRule(fam byte, data []byte) (rule, string, string, error) {
	ad, err := attrs(data)
	if err != nil {
		return rule{}, "", "", err
	}
	var r rule
	var table, chain string
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_RULE_TABLE:
			table = ad.String()
		case unix.NFTA_RULE_CHAIN:
			chain = ad.String()
		case unix.NFTA_RULE_HANDLE:
			r.handle = ad.Uint64()
		case unix.NFTA_RULE_EXPRESSIONS:
			ad.Nested(func(list *netlinkDecoder) error {
				for list.Next() {
					list.Nested(func(el *netlinkDecoder) error {
						var name string
						hasData := false
						for el.Next() {
							switch el.Type() {
							case unix.NFTA_EXPR_NAME:
								name = el.String()
							case unix.NFTA_EXPR_DATA:
								hasData = true
								e, err := unmarshalExpr(fam, name, el.Bytes())
								if err != nil {
									return err
								}
								if e == nil {
									r.foreign = name
								} else {
									r.exprs = append(r.exprs, e)
								}
							}
						}
						if !hasData && r.foreign == "" {
							r.foreign = name // none of ours comes without data
						}
						return nil
					})
				}
				return nil
			})
		}
	}
	return r, table, chain, ad.Err()
}

// unmarshalExpr decodes one expression of the kinds iptables-nft's rules of ours are made of;
// any other kind returns nil, which marks the rule foreign.
func unmarshalExpr(fam byte, name string, data []byte) (expr.Any, error) {
	var e expr.Any
	switch name {
	case "meta":
		e = &expr.Meta{}
	case "cmp":
		e = &expr.Cmp{}
	case "payload":
		e = &expr.Payload{}
	case "bitwise":
		e = &expr.Bitwise{}
	case "range":
		e = &expr.Range{}
	case "match":
		e = &expr.Match{}
	case "target":
		e = &expr.Target{}
	case "counter":
		e = &expr.Counter{}
	case "immediate":
		// A verdict is an immediate that writes the verdict register.
		im := &expr.Immediate{}
		if err := expr.Unmarshal(fam, data, im); err != nil {
			return nil, fmt.Errorf("expression immediate: %w", err)
		}
		if im.Register != unix.NFT_REG_VERDICT {
			return im, nil
		}
		e = &expr.Verdict{}
	default:
		return nil, nil
	}
	if err := expr.Unmarshal(fam, data, e); err != nil {
		return nil, fmt.Errorf("expression %s: %w", name, err)
	}
	return e, nil
}

// netlinkDecoder is the attribute decoder nested attributes are read with.
type netlinkDecoder = netlink.AttributeDecoder
