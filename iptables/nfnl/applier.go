package nfnl

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/internal/errclass"
)

// Applier writes, reads back and removes our rules over nf_tables netlink. It implements
// iptables.Applier. It holds no connection between calls: each opens its socket in the network
// namespace of the calling thread and closes it before returning.
type Applier struct {
	covers []iptables.Backend
}

var _ iptables.Applier = (*Applier)(nil)

// New returns the applier that writes the first of backends, iptables.BackendNFT (iptables-nft's
// rules) or iptables.BackendNFTables (the native table), and covers every one given: their rules
// of ours are read in the same read, reported by Show and Present, and removed by Apply and
// Cleanup in the same batch. Backends other than those two, and repeats, are ignored.
func New(backends ...iptables.Backend) *Applier {
	a := &Applier{}
	for _, b := range backends {
		if (b == iptables.BackendNFT || b == iptables.BackendNFTables) && !a.covered(b) {
			a.covers = append(a.covers, b)
		}
	}
	if len(a.covers) == 0 {
		a.covers = []iptables.Backend{iptables.BackendNFT}
	}
	return a
}

// Name is the backend Apply writes: "iptables-nft" or "nftables".
func (a *Applier) Name() string { return string(a.covers[0]) }

// Covers lists the backends the applier writes (first) and clears.
func (a *Applier) Covers() []iptables.Backend { return a.covers }

func (a *Applier) covered(b iptables.Backend) bool { return slices.Contains(a.covers, b) }

// op names what a call does, for errors: "write the iptables-nft nat rules".
func (a *Applier) op(verb string) string {
	if a.covers[0] == iptables.BackendNFTables {
		return verb + " the nftables table inet " + iptables.NFTTableName
	}
	return verb + " the iptables-nft nat rules"
}

// Apply makes our rules exactly rs's, in one transaction that also removes ours from the other
// backends the applier covers, and writes nothing when everything already matches.
func (a *Applier) Apply(ctx context.Context, rs *iptables.Ruleset) (iptables.Result, error) {
	if rs == nil {
		return iptables.Result{}, fmt.Errorf("%s: no ruleset", a.op("write"))
	}
	changed, err := transact(ctx, a.op("write"), a.want(rs), func(s *State) *Batch { return a.batch(s, rs) })
	return iptables.Result{Changed: changed}, err
}

// Cleanup removes our rules from every backend the applier covers, in one transaction. It
// succeeds when there is nothing to remove.
func (a *Applier) Cleanup(ctx context.Context) error {
	_, err := transact(ctx, a.op("remove"), a.want(nil), func(s *State) *Batch { return a.batch(s, nil) })
	return err
}

// BatchFor returns the batch Apply (rs non-nil) or Cleanup (rs nil) would send now, sending nothing.
// When the state in place cannot be read (no privilege, for one), it is the batch for a
// namespace holding no tables, which says why.
func (a *Applier) BatchFor(ctx context.Context, rs *iptables.Ruleset) *Batch {
	s, err := readOnce(ctx, a.want(rs))
	if err != nil {
		why := errclass.Netlink("read the nf_tables ruleset", err)
		var ce *iptables.CapabilityError
		if errors.As(why, &ce) {
			why = fmt.Errorf("reading it needs %s in network namespace %s", strings.Join(ce.Caps, " and "), ce.NetNS)
		}
		s = emptyState(why.Error())
	}
	return a.batch(s, rs)
}

// PlanFresh returns the batch Apply (rs non-nil) or Cleanup (rs nil) would send to a namespace
// holding no tables: what Plan shows where the state in place cannot be read; why says why.
func (a *Applier) PlanFresh(rs *iptables.Ruleset, why string) *Batch {
	return a.batch(emptyState(why), rs)
}

// want is what Apply of rs, or Cleanup (rs nil), needs to know beyond the table list:
// iptables-nft's tables of ours when the applier writes or clears them (Cleanup deletes their
// rules of ours one by one), and the native table only when a write may find it already rs's
// (it is deleted unread otherwise; Cleanup deletes it whole).
func (a *Applier) want(rs *iptables.Ruleset) func(*State) detail {
	return func(*State) detail {
		d := detail{xt: a.covered(iptables.BackendNFT)}
		if rs != nil && a.covers[0] == iptables.BackendNFTables {
			d.native, d.nativeIf = true, nativeReadWorthIt(rs)
		}
		return d
	}
}

// readDetail is what Show and Present need: every covered table.
func (a *Applier) readDetail(*State) detail {
	return detail{xt: a.covered(iptables.BackendNFT), native: a.covered(iptables.BackendNFTables)}
}

// batch is the batch Apply (rs non-nil) or Cleanup (rs nil) plans from s: the first backend
// written, the others cleared.
func (a *Applier) batch(s *State, rs *iptables.Ruleset) *Batch {
	b := newBatch(s)
	for i, c := range a.covers {
		switch {
		case i > 0 || rs == nil:
			s.remove(b, c)
		case c == iptables.BackendNFT:
			s.writeXT(b, rs)
		default:
			s.writeNative(b, rs)
		}
	}
	return b
}

// remove adds to b what deletes our rules from backend c.
func (s *State) remove(b *Batch, c iptables.Backend) {
	if c == iptables.BackendNFTables {
		s.removeNative(b)
		return
	}
	for _, f := range families {
		for _, t := range iptables.XTTables() {
			s.removeXT(b, f, t.Name)
		}
	}
}

// transact reads the state, lays a batch out and commits it, laying it out again from a fresh read
// when the kernel refuses the batch because the ruleset changed in between (another writer at
// the same moment). It reports whether anything was sent.
func transact(ctx context.Context, op string, want func(*State) detail, batch func(*State) *Batch) (bool, error) {
	for attempt := 1; ; attempt++ {
		sent, err := transactOnce(ctx, want, batch)
		if err == nil {
			return sent, nil
		}
		if attempt == attempts || !stale(err) || ctx.Err() != nil {
			return false, errclass.Netlink(op, err)
		}
	}
}

func transactOnce(ctx context.Context, want func(*State) detail, batch func(*State) *Batch) (bool, error) {
	c, err := dial(ctx)
	if err != nil {
		return false, err
	}
	defer c.close()
	s, err := read(c, want)
	if err != nil {
		return false, err
	}
	b := batch(s)
	return b.Len() > 0, c.commit(b)
}

// readOnce reads the state on a socket of its own.
func readOnce(ctx context.Context, want func(*State) detail) (*State, error) {
	c, err := dial(ctx)
	if err != nil {
		return nil, err
	}
	defer c.close()
	return read(c, want)
}

// Show reads our rules back and compares them with rs's: per family as iptables-nft-save lines
// (iptables-nft), or as the native table's nft statements under the one family "inet". Rules of
// ours in the other backends the applier covers are in State.Elsewhere.
func (a *Applier) Show(ctx context.Context, rs *iptables.Ruleset) (iptables.State, error) {
	if rs == nil {
		return iptables.State{}, fmt.Errorf("%s: no ruleset", a.op("read"))
	}
	s, err := readOnce(ctx, a.readDetail)
	if err != nil {
		return iptables.State{}, errclass.Netlink(a.op("read"), err)
	}
	st := iptables.State{Backend: a.Name()}
	if a.covers[0] == iptables.BackendNFT {
		for _, f := range families {
			st.Families = append(st.Families, rs.FamilyState(f, s.saved(f)))
		}
	} else {
		st.Families = []iptables.FamilyState{s.nativeState(rs)}
	}
	st.Elsewhere = s.present(a.covers[1:])
	return st, nil
}

// nativeState is the native table compared with rs's.
func (s *State) nativeState(rs *iptables.Ruleset) iptables.FamilyState {
	h := s.holdings()[1]
	fs := iptables.FamilyState{Family: iptables.FamilyInet, Diff: iptables.CompareNFT(rs.NFT(), h.Table)}
	if h.Table != nil {
		fs.Rules = h.Table.Statements()
	}
	// The model has chains and sets only; the kernel's count shows anything else.
	if h.Other > 0 {
		fs.Diff.Extra = append(fs.Diff.Extra, iptables.OtherObjects(h.Other))
	}
	return fs
}

// Present lists what of ours each covered backend holds: iptables-nft's chains and rules,
// prefixed with their family, and someone else's jumps into our chains; the native table's nft
// statements.
func (a *Applier) Present(ctx context.Context) ([]iptables.Elsewhere, error) {
	s, err := readOnce(ctx, a.readDetail)
	if err != nil {
		return nil, errclass.Netlink(a.op("read"), err)
	}
	return s.present(a.covers), nil
}

func (s *State) present(backends []iptables.Backend) []iptables.Elsewhere {
	var out []iptables.Elsewhere
	for _, c := range backends {
		for _, h := range s.holdings() {
			if h.Backend == c {
				out = append(out, h.Elsewhere()...)
			}
		}
	}
	return out
}

// Read returns what of ours nf_tables holds, for show to inspect without a configuration:
// iptables-nft's rules per family, and the native table (Table nil when absent). Both are written
// over netlink in one transaction for both families; the iptables-nft binaries, which write one
// per family, leave the same rules, and cannot be told apart.
func Read(ctx context.Context) ([]iptables.Holding, error) {
	s, err := readOnce(ctx, func(*State) detail { return detail{xt: true, native: true} })
	if err != nil {
		return nil, errclass.Netlink("read the nf_tables ruleset", err)
	}
	return s.holdings(), nil
}

// holdings is what of ours the state holds: iptables-nft's rules, then the native table (nil
// when absent or unread).
func (s *State) holdings() []iptables.Holding {
	xt := iptables.Holding{Backend: iptables.BackendNFT, Saved: map[iptables.Family]iptables.SavedState{}}
	for _, f := range families {
		xt.Saved[f] = s.saved(f)
	}
	native := iptables.Holding{Backend: iptables.BackendNFTables}
	if t := s.findTable(famInet, iptables.NFTTableName); t != nil && s.native != nil {
		native.Table = nativeTable(s.native, t.comment)
		native.Other = max(0, int(t.use)-len(native.Table.Chains)-len(native.Table.Sets))
	}
	return []iptables.Holding{xt, native}
}

// OurXTTables lists the tables of iptables-nft's family f that hold one of our chains, in
// iptables.XTTables order, as the iptables-nft binaries' applier asks before running
// iptables-nft-save.
func OurXTTables(ctx context.Context, f iptables.Family) ([]string, error) {
	s, err := readOnce(ctx, func(*State) detail { return detail{xtChains: true} })
	if err != nil {
		return nil, errclass.Netlink("read the iptables-nft chains", err)
	}
	var out []string
	for _, tbl := range iptables.XTTables() {
		if t := s.xtTable(xtFamily(f), tbl.Name); t != nil && slices.ContainsFunc(t.chains, func(c chain) bool {
			return iptables.ChainTable(c.name) == tbl.Name
		}) {
			out = append(out, tbl.Name)
		}
	}
	return out, nil
}
