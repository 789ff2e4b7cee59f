package nfnl

// The one read of kernel state (see the package comment): the generation and the table list in
// one round trip, which google/nftables' Conn cannot do (all a fresh namespace costs), then the
// detail of the tables that matter, expressions decoded by google/nftables.

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"

	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/iptables"
)

// Attributes and values that golang.org/x/sys/unix does not define.
const (
	nftaTableHandle   = 4 // NFTA_TABLE_HANDLE
	nftaTableUserdata = 6 // NFTA_TABLE_USERDATA
	udataTableComment = 0 // NFTNL_UDATA_TABLE_COMMENT
)

const (
	famIP   = unix.NFPROTO_IPV4
	famIP6  = unix.NFPROTO_IPV6
	famInet = unix.NFPROTO_INET
)

// State is what one read found in the namespace: the generation it was read at, every table, and
// the detail of the tables of ours.
type State struct {
	gen uint32
	// unread says why the kernel's state was not read ("" when it was): the planner then plans
	// for a namespace holding no tables, which is what --simulate shows without privileges.
	unread string
	tables []table
	// xt holds iptables-nft's tables of ours (nat, and mangle and raw) that exist, by family
	// (ip, ip6) and name, when read in detail.
	xt map[xtKey]*ruleTable
	// native is the native table, when it exists and was read in detail.
	native *ruleTable
}

// xtKey names one of iptables-nft's tables: its family (ip, ip6) and name.
type xtKey struct {
	fam  byte
	name string
}

// xtTable returns the detail of iptables-nft's table of that family and name, or nil.
func (s *State) xtTable(fam byte, name string) *ruleTable { return s.xt[xtKey{fam, name}] }

type table struct {
	family  byte
	name    string
	handle  uint64
	use     uint32
	comment string
}

// ruleTable is one table read in detail.
type ruleTable struct {
	chains []chain // in the kernel's order
	rules  map[string][]rule
	sets   []set // the native table's
}

type chain struct {
	name     string
	base     bool
	hook     uint32
	priority int32
	typ      string
	policy   uint32
}

func (t *ruleTable) hasChain(name string) bool {
	return slices.ContainsFunc(t.chains, func(c chain) bool { return c.name == name })
}

// rule is one rule read back.
type rule struct {
	handle  uint64
	exprs   []expr.Any
	comment string // the rule's userdata comment (nft's "comment"; iptables-nft uses a match)
	// foreign names an expression this package does not decode, which makes the rule not ours.
	foreign string
}

type set struct {
	name    string
	flags   uint32
	keyType uint32
	elems   []element
}

type element struct {
	key []byte
	end bool
}

// emptyState is the state of a namespace holding no tables, planned for when the kernel's cannot
// be read; why says why.
func emptyState(why string) *State { return &State{unread: why} }

// findTable returns the table of that family and name, or nil.
func (s *State) findTable(family byte, name string) *table {
	for i := range s.tables {
		if s.tables[i].family == family && s.tables[i].name == name {
			return &s.tables[i]
		}
	}
	return nil
}

// detail says which tables a read looks into beyond the table list.
type detail struct {
	// xt: iptables-nft's tables of ours (chains and rules); xtChains: only their chains.
	xt, xtChains bool
	// native: the native table's chains, rules, sets and elements, when the table exists and
	// nativeIf (nil: always) says so.
	native   bool
	nativeIf func(t *table) bool
}

// read reads the state: the generation and every table, then what want asks for given them.
// When it had to look into tables, it reads the generation again and starts over if the ruleset
// changed in between (or an object listed was gone when its detail was read), so the state is
// one the kernel held at once (a batch planned from it is checked by the kernel anyway; Show and
// a write found unnecessary rely on this).
func read(src source, want func(*State) detail) (*State, error) {
	for attempt := 1; ; attempt++ {
		s, err := readTables(src)
		if err != nil {
			return nil, err
		}
		looked, err := s.readDetail(src, want(s))
		if errors.Is(err, unix.ENOENT) && attempt < attempts {
			continue // a table or set listed a moment ago was replaced meanwhile
		}
		if err != nil {
			return nil, err
		}
		if !looked {
			return s, nil
		}
		ans, err := src.exchange(request{key: "getgen", typ: unix.NFT_MSG_GETGEN})
		if err != nil {
			return nil, fmt.Errorf("read the nf_tables generation: %w", err)
		}
		if gen, err := decodeGen(ans[0]); err != nil || gen == s.gen {
			return s, err
		}
		if attempt == attempts {
			return nil, fmt.Errorf("the nf_tables ruleset kept changing while it was read (%d attempts)", attempt)
		}
	}
}

// attempts bounds the reads, and the batches planned again, after another writer changed the
// ruleset in between. Each time, that other writer's transaction has committed, so the next read
// sees it settled; the runner's namespace lock keeps our own writers from racing at all.
const attempts = 10

func decodeGen(ms []netlink.Message) (uint32, error) {
	for _, m := range ms {
		if msgType(m) != unix.NFT_MSG_NEWGEN {
			continue
		}
		var gen uint32
		err := eachMsgAttr(m, func(ad *netlink.AttributeDecoder) {
			if ad.Type() == unix.NFTA_GEN_ID {
				gen = ad.Uint32()
			}
		})
		return gen, err
	}
	return 0, errors.New("no generation in the kernel's answer")
}

// readTables reads the generation and every table, in one round trip.
func readTables(src source) (*State, error) {
	ans, err := src.exchange(
		request{key: "getgen", typ: unix.NFT_MSG_GETGEN},
		request{key: "gettable", typ: unix.NFT_MSG_GETTABLE, flags: netlink.Dump},
	)
	if err != nil {
		return nil, fmt.Errorf("list the nf_tables tables: %w", err)
	}
	s := &State{}
	if s.gen, err = decodeGen(ans[0]); err != nil {
		return nil, fmt.Errorf("read the nf_tables generation: %w", err)
	}
	for _, m := range ans[1] {
		t := table{family: family(m)}
		if err := eachMsgAttr(m, func(ad *netlink.AttributeDecoder) {
			switch ad.Type() {
			case unix.NFTA_TABLE_NAME:
				t.name = ad.String()
			case unix.NFTA_TABLE_USE:
				t.use = ad.Uint32()
			case nftaTableHandle:
				t.handle = ad.Uint64()
			case nftaTableUserdata:
				t.comment, _ = userdata.GetString(ad.Bytes(), udataTableComment)
			}
		}); err != nil {
			return nil, fmt.Errorf("decode a table: %w", err)
		}
		s.tables = append(s.tables, t)
	}
	return s, nil
}

// readDetail reads what d asks for, and reports whether it read anything beyond the table list.
func (s *State) readDetail(src source, d detail) (bool, error) {
	var xts []xtKey // in a fixed order, that of the reads
	s.xt = map[xtKey]*ruleTable{}
	for _, fam := range []byte{famIP, famIP6} {
		for _, t := range iptables.XTTables() {
			if k := (xtKey{fam, t.Name}); (d.xt || d.xtChains) && s.findTable(fam, t.Name) != nil {
				xts, s.xt[k] = append(xts, k), &ruleTable{rules: map[string][]rule{}}
			}
		}
	}
	nt := s.findTable(famInet, iptables.NFTTableName)
	native := d.native && nt != nil && (d.nativeIf == nil || d.nativeIf(nt))
	if len(xts) == 0 && !native {
		return false, nil
	}
	if native {
		s.native = &ruleTable{rules: map[string][]rule{}}
	}
	// One dump of every family's chains, kept for the tables of interest.
	ans, err := src.exchange(request{key: "getchain", typ: unix.NFT_MSG_GETCHAIN, flags: netlink.Dump})
	if err != nil {
		return true, fmt.Errorf("list the nf_tables chains: %w", err)
	}
	for _, m := range ans[0] {
		c, tbl, err := decodeChain(m)
		if err != nil {
			return true, fmt.Errorf("decode a chain: %w", err)
		}
		t := s.xt[xtKey{family(m), tbl}]
		if family(m) == famInet && tbl == iptables.NFTTableName {
			t = s.native
		}
		if t != nil {
			t.chains = append(t.chains, c)
		}
	}
	if d.xt {
		for _, k := range xts {
			if err := s.readRules(src, k.fam, k.name, s.xt[k]); err != nil {
				return true, err
			}
		}
	}
	if native {
		if err := s.readRules(src, famInet, iptables.NFTTableName, s.native); err != nil {
			return true, err
		}
		if err := s.readSets(src); err != nil {
			return true, err
		}
	}
	return true, nil
}

func decodeChain(m netlink.Message) (chain, string, error) {
	var c chain
	var tbl string
	err := eachMsgAttr(m, func(ad *netlink.AttributeDecoder) {
		switch ad.Type() {
		case unix.NFTA_CHAIN_TABLE:
			tbl = ad.String()
		case unix.NFTA_CHAIN_NAME:
			c.name = ad.String()
		case unix.NFTA_CHAIN_TYPE:
			c.typ = ad.String()
		case unix.NFTA_CHAIN_POLICY:
			c.policy = ad.Uint32()
		case unix.NFTA_CHAIN_HOOK:
			c.base = true
			nested(ad, func(nd *netlink.AttributeDecoder) {
				switch nd.Type() {
				case unix.NFTA_HOOK_HOOKNUM:
					c.hook = nd.Uint32()
				case unix.NFTA_HOOK_PRIORITY:
					c.priority = int32(nd.Uint32())
				}
			})
		}
	})
	return c, tbl, err
}

// readRules reads the rules of one table. Each dump names its family: given a table name, the
// kernel stops after the first table of that name, whatever the family.
func (s *State) readRules(src source, fam byte, name string, t *ruleTable) error {
	ans, err := src.exchange(request{key: "getrule " + famName[fam] + " " + name, typ: unix.NFT_MSG_GETRULE, flags: netlink.Dump, fam: fam, name: name})
	if err != nil {
		return fmt.Errorf("list the rules of table %s %s: %w", famName[fam], name, err)
	}
	for _, m := range ans[0] {
		r, tbl, ch, err := decodeRule(fam, m)
		if err != nil {
			return fmt.Errorf("decode a rule of table %s %s: %w", famName[fam], name, err)
		}
		if family(m) == fam && tbl == name {
			t.rules[ch] = append(t.rules[ch], r)
		}
	}
	return nil
}

func decodeRule(fam byte, m netlink.Message) (rule, string, string, error) {
	var r rule
	var tbl, ch string
	err := eachMsgAttr(m, func(ad *netlink.AttributeDecoder) {
		switch ad.Type() {
		case unix.NFTA_RULE_TABLE:
			tbl = ad.String()
		case unix.NFTA_RULE_CHAIN:
			ch = ad.String()
		case unix.NFTA_RULE_HANDLE:
			r.handle = ad.Uint64()
		case unix.NFTA_RULE_USERDATA:
			r.comment, _ = userdata.GetString(ad.Bytes(), userdata.TypeComment)
		case unix.NFTA_RULE_EXPRESSIONS:
			nested(ad, func(el *netlink.AttributeDecoder) {
				el.Nested(func(nd *netlink.AttributeDecoder) error { return r.decodeExpr(fam, nd) })
			})
		}
	})
	return r, tbl, ch, err
}

// decodeExpr decodes one list element: an expression's name and data.
func (r *rule) decodeExpr(fam byte, el *netlink.AttributeDecoder) error {
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
}

// exprKinds are the expressions our rules, in either representation, are made of, by the
// kernel's name; a verdict is an immediate that writes the verdict register. The tables of this
// package are arrays, and values filled on first use: the CNI plugin links it, and a map in a
// package variable is built at every start (TestPluginRunsNoInitialiserOfOurs).
var exprKinds = [...]exprKind{
	{"meta", newExpr[expr.Meta]}, {"cmp", newExpr[expr.Cmp]}, {"payload", newExpr[expr.Payload]},
	{"bitwise", newExpr[expr.Bitwise]}, {"range", newExpr[expr.Range]}, {"lookup", newExpr[expr.Lookup]},
	{"match", newExpr[expr.Match]}, {"target", newExpr[expr.Target]}, {"counter", newExpr[expr.Counter]},
	{"redir", newExpr[expr.Redir]}, {"ct", newExpr[expr.Ct]}, {"tproxy", newExpr[expr.TProxy]},
	{"immediate", newExpr[expr.Immediate]},
}

type exprKind struct {
	name string
	mk   func() expr.Any
}

func newExpr[T any, P interface {
	*T
	expr.Any
}]() expr.Any {
	return P(new(T))
}

// exprNames is exprKinds the other way round, built on first use.
var (
	exprNamesOnce sync.Once
	exprNames     map[reflect.Type]string
)

// exprName is the kernel's name of an expression of the kinds our rules hold.
func exprName(e expr.Any) string {
	exprNamesOnce.Do(func() {
		exprNames = map[reflect.Type]string{reflect.TypeFor[*expr.Verdict](): "immediate"}
		for _, k := range exprKinds {
			exprNames[reflect.TypeOf(k.mk())] = k.name
		}
	})
	if name, ok := exprNames[reflect.TypeOf(e)]; ok {
		return name
	}
	return fmt.Sprintf("%T", e)
}

// unmarshalExpr decodes one expression of exprKinds; any other kind returns nil, which marks the
// rule as not ours.
func unmarshalExpr(fam byte, name string, data []byte) (expr.Any, error) {
	k := slices.IndexFunc(exprKinds[:], func(k exprKind) bool { return k.name == name })
	if k < 0 {
		return nil, nil
	}
	e, err := exprKinds[k].mk(), error(nil)
	switch x := e.(type) {
	case *expr.Ct:
		// google/nftables' Ct does not read a source register (ct zone set).
		err = eachAttr(data, func(ad *netlink.AttributeDecoder) {
			switch ad.Type() {
			case unix.NFTA_CT_KEY:
				x.Key = expr.CtKey(ad.Uint32())
			case unix.NFTA_CT_DREG:
				x.Register = ad.Uint32()
			case unix.NFTA_CT_SREG:
				x.Register, x.SourceRegister = ad.Uint32(), true
			case unix.NFTA_CT_DIRECTION:
				x.Direction = uint32(ad.Uint8())
			}
		})
	case *expr.TProxy:
		// google/nftables' TProxy reads its family attribute, a u32, as a byte, and fails.
		err = eachAttr(data, func(ad *netlink.AttributeDecoder) {
			switch ad.Type() {
			case expr.NFTA_TPROXY_FAMILY:
				x.Family = byte(ad.Uint32())
			case expr.NFTA_TPROXY_REG_PORT:
				x.RegPort = ad.Uint32()
			case expr.NFTA_TPROXY_REG_ADDR:
				x.RegAddr = ad.Uint32()
			}
		})
	default:
		err = expr.Unmarshal(fam, data, e)
	}
	if err != nil {
		return nil, fmt.Errorf("expression %s: %w", name, err)
	}
	switch x := e.(type) {
	case *expr.Immediate:
		if x.Register == unix.NFT_REG_VERDICT {
			v := &expr.Verdict{}
			if err := expr.Unmarshal(fam, data, v); err != nil {
				return nil, fmt.Errorf("expression %s: %w", name, err)
			}
			return v, nil
		}
	case *expr.Redir:
		// The kernel dumps the maximum port's register as the minimum's when only that was given.
		if x.RegisterProtoMax == x.RegisterProtoMin {
			x.RegisterProtoMax = 0
		}
	}
	return e, nil
}

// readSets reads the native table's sets and their elements.
func (s *State) readSets(src source) error {
	ans, err := src.exchange(request{key: "getset inet " + iptables.NFTTableName, typ: unix.NFT_MSG_GETSET, flags: netlink.Dump,
		fam: famInet, name: iptables.NFTTableName})
	if err != nil {
		return fmt.Errorf("list the sets of table inet %s: %w", iptables.NFTTableName, err)
	}
	for _, m := range ans[0] {
		var st set
		var tbl string
		if err := eachMsgAttr(m, func(ad *netlink.AttributeDecoder) {
			switch ad.Type() {
			case unix.NFTA_SET_TABLE:
				tbl = ad.String()
			case unix.NFTA_SET_NAME:
				st.name = ad.String()
			case unix.NFTA_SET_FLAGS:
				st.flags = ad.Uint32()
			case unix.NFTA_SET_KEY_TYPE:
				st.keyType = ad.Uint32()
			}
		}); err != nil {
			return fmt.Errorf("decode a set: %w", err)
		}
		if tbl != iptables.NFTTableName || family(m) != famInet {
			continue
		}
		ans, err := src.exchange(request{key: "getsetelem inet " + iptables.NFTTableName + " " + st.name, typ: unix.NFT_MSG_GETSETELEM,
			flags: netlink.Dump, fam: famInet, name: iptables.NFTTableName, set: st.name})
		if err != nil {
			return fmt.Errorf("list the elements of set %s: %w", st.name, err)
		}
		for _, m := range ans[0] {
			if err := st.decodeElements(m); err != nil {
				return fmt.Errorf("decode the elements of set %s: %w", st.name, err)
			}
		}
		s.native.sets = append(s.native.sets, st)
	}
	return nil
}

func (st *set) decodeElements(m netlink.Message) error {
	return eachMsgAttr(m, func(ad *netlink.AttributeDecoder) {
		if ad.Type() != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
			return
		}
		nested(ad, func(el *netlink.AttributeDecoder) {
			var e element
			nested(el, func(a *netlink.AttributeDecoder) {
				switch a.Type() {
				case unix.NFTA_SET_ELEM_KEY:
					nested(a, func(k *netlink.AttributeDecoder) {
						if k.Type() == unix.NFTA_DATA_VALUE {
							e.key = slices.Clone(k.Bytes())
						}
					})
				case unix.NFTA_SET_ELEM_FLAGS:
					e.end = a.Uint32()&unix.NFT_SET_ELEM_INTERVAL_END != 0
				}
			})
			st.elems = append(st.elems, e)
		})
	})
}

// famName is the name nft gives one of our tables' families.
var famName = [256]string{famIP: "ip", famIP6: "ip6", famInet: "inet"}
