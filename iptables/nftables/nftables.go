// Package nftables is the native nftables backend: it writes the builder's inet table
// (iptables.Ruleset.NFT) over netlink, with no iptables or nft binary and no exec.
//
// Apply is one nftables transaction (one sendmsg): it deletes our table if present and creates
// it anew with its sets, chains and rules, and in the same transaction removes the chains and
// jumps that iptables-nft wrote for us. The kernel commits all of it or none, so there is no
// moment without rules and no half state. The table's comment records the plan; a re-run whose
// plan matches and whose table reads back intact writes nothing.
//
// Connections: each call opens its own sockets and closes them before returning: a raw netlink
// socket for the table list and the batch, and, only when the table must be read in detail, a
// lasting google/nftables connection. Nothing outlives a call, so a socket is never used in a
// namespace other than the one it was opened in, and a fresh namespace costs one table dump and
// one batch.
//
// Namespaces: by default every socket is opened in the network namespace of the calling OS
// thread, so callers enter the target namespace on a locked thread first (internal/netnsutil).
// WithNetNS instead opens the sockets in the namespace an fd refers to, without the caller
// switching threads.
//
// Limits: the applier decides nothing about which rules exist (that is iptables.Ruleset.NFT);
// it cannot see iptables-legacy rules, which live outside nftables; it needs CAP_NET_ADMIN in
// the namespace (a *iptables.CapabilityError otherwise) and a kernel with nf_tables, nat chains
// and the redir expression (an error wrapping iptables.ErrUnsupported otherwise).
// Table comments need Linux 5.13 or later; an older kernel drops the plan comment, so every
// Apply there rewrites the table (still in one transaction) instead of skipping the write.
package nftables

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/internal/errclass"
)

// Name is what logs and show call this backend.
const Name = "nftables"

// Option configures where the applier works.
type Option func(*options)

type options struct {
	netns int
}

// WithNetNS opens the netlink sockets in the network namespace that fd refers to (an open
// /proc/PID/ns/net or /var/run/netns/NAME) instead of the calling thread's. The fd must stay
// open while the applier is used.
func WithNetNS(fd int) Option {
	return func(o *options) { o.netns = fd }
}

// Applier writes, reads back and removes our nftables table. It implements iptables.Applier.
// It holds no connection between calls, so one Applier may be used from any goroutine; each
// call opens its sockets in the namespace current at that moment (or the WithNetNS one).
type Applier struct {
	opts options
}

var _ iptables.Applier = (*Applier)(nil)

// New returns an applier.
func New(opts ...Option) *Applier {
	a := &Applier{}
	for _, o := range opts {
		o(&a.opts)
	}
	return a
}

// Name returns "nftables".
func (a *Applier) Name() string { return Name }

// ClearsOnApply names the backend whose rules of ours Apply removes in its own transaction:
// iptables-nft's chains and jumps.
func (a *Applier) ClearsOnApply() []string { return []string{"iptables-nft"} }

// session is the sockets of one call: a raw netlink socket for the table list and the batch,
// and, only when something must be read in detail, a google/nftables connection.
type session struct {
	opts options
	ctx  context.Context
	nl   *netlink.Conn
	gc   *nftables.Conn
}

func open(ctx context.Context, o options) (*session, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// One fixed receive buffer instead of peeking at each answer's size first: a batch is
	// answered with an ack per message, and the peek doubled their system calls. The kernel
	// never sends a datagram larger than 32 KiB on this socket (dump pages are capped there).
	nl, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: o.netns, MessageBufferSize: 32 << 10})
	if err != nil {
		return nil, fmt.Errorf("open nftables netlink socket: %w", err)
	}
	// Errors echo only the header of the refused message, not the whole message, and carry the
	// kernel's explanation where it gives one.
	_ = nl.SetOption(netlink.CapAcknowledge, true)
	_ = nl.SetOption(netlink.ExtendedAcknowledge, true)
	if d, ok := ctx.Deadline(); ok {
		if err := nl.SetDeadline(d); err != nil {
			nl.Close()
			return nil, fmt.Errorf("set netlink deadline: %w", err)
		}
	}
	return &session{opts: o, ctx: ctx, nl: nl}, nil
}

// google returns the session's google/nftables connection, opening it on first use.
func (s *session) google() (*nftables.Conn, error) {
	if s.gc != nil {
		return s.gc, nil
	}
	opts := []nftables.ConnOption{nftables.AsLasting(), nftables.WithNetNSFd(s.opts.netns)}
	if d, ok := s.ctx.Deadline(); ok {
		opts = append(opts, nftables.WithSockOptions(func(c *netlink.Conn) error { return c.SetDeadline(d) }))
	}
	gc, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("open nftables connection: %w", err)
	}
	s.gc = gc
	return gc, nil
}

func (s *session) close() {
	if s.gc != nil {
		_ = s.gc.CloseLasting()
	}
	_ = s.nl.Close()
}

// Apply makes our table exactly rs's, in one transaction that also removes iptables-nft rules of
// ours. When the table already records rs's plan and reads back identical, and no iptables-nft
// rules of ours exist, it writes nothing and reports Changed false.
func (a *Applier) Apply(ctx context.Context, rs *iptables.Ruleset) (iptables.Result, error) {
	if rs == nil {
		return iptables.Result{}, errors.New("nftables apply: no ruleset")
	}
	want := rs.NFT()
	// What is read first (iptables-nft rule handles) can vanish before the batch lands if
	// something else writes at the same time; the kernel then refuses the whole batch, and one
	// fresh attempt, on fresh sockets (a refused batch leaves unread answers behind), settles it.
	res, err := a.applyOnce(ctx, want)
	var be *BatchError
	if errors.As(err, &be) && (errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EBUSY)) {
		res, err = a.applyOnce(ctx, want)
	}
	return res, errclass.Netlink("nftables apply", err)
}

func (a *Applier) applyOnce(ctx context.Context, want iptables.NFTTable) (iptables.Result, error) {
	s, err := open(ctx, a.opts)
	if err != nil {
		return iptables.Result{}, err
	}
	defer s.close()
	return s.apply(want)
}

func (s *session) apply(want iptables.NFTTable) (iptables.Result, error) {
	tables, err := listTables(s.nl)
	if err != nil {
		return iptables.Result{}, err
	}
	var b batch
	xt, err := xtRemoval(&b, s.google, tables)
	if err != nil {
		return iptables.Result{}, err
	}
	// Cheap checks first: the recorded plan, and the table's object count (chains, sets and
	// anything else someone added to it); only then the full read-back.
	if ours := findTable(tables, inet, iptables.NFTTableName); ours != nil && ours.Comment == want.Comment && xt == 0 &&
		ours.Use == uint32(len(want.Chains)+len(want.Sets)) {
		gc, err := s.google()
		if err != nil {
			return iptables.Result{}, err
		}
		// A read that fails (typically because something replaced the table while it was being
		// read; google/nftables does not keep the errno to tell) leaves the table unverified,
		// so it is rewritten: the write succeeds or reports its own error.
		if have, err := readTable(gc, ours.Comment); err == nil && iptables.CompareNFT(want, have).Empty() {
			return iptables.Result{Changed: false}, nil
		}
	}
	if findTable(tables, inet, iptables.NFTTableName) == nil {
		// A fresh namespace: a batch that only adds. The ensure-then-delete of replaceTable
		// would make the kernel create and tear down a table in the same transaction.
		b.addTable(iptables.NFTTableName, want)
	} else {
		b.replaceTable(want)
	}
	if err := b.send(s.nl); err != nil {
		return iptables.Result{}, err
	}
	return iptables.Result{Changed: true}, nil
}

// Show reads our table back and compares it with rs's. The state has one entry, for family
// iptables.FamilyInet, whose rules are the table's nft statements. (Rules of ours in other
// backends, iptables-nft's included, are the backend runner's to report, as State.Elsewhere.)
func (a *Applier) Show(ctx context.Context, rs *iptables.Ruleset) (iptables.State, error) {
	if rs == nil {
		return iptables.State{}, errors.New("nftables show: no ruleset")
	}
	st, err := a.showOnce(ctx, rs)
	if err != nil && ctx.Err() == nil {
		// An object that vanished between two reads means the table was being replaced
		// (google/nftables does not keep the errno to tell): read once more.
		st, err = a.showOnce(ctx, rs)
	}
	return st, errclass.Netlink("nftables show", err)
}

func (a *Applier) showOnce(ctx context.Context, rs *iptables.Ruleset) (iptables.State, error) {
	var st iptables.State
	err := withTables(ctx, a.opts, func(s *session, tables []tableInfo) error {
		ours, have, err := s.readOurs(tables)
		if err != nil {
			return err
		}
		var lines []string
		diff := iptables.CompareNFT(rs.NFT(), have)
		if ours != nil {
			lines = have.Statements()
			// The model has chains and sets only; the kernel's count shows anything else.
			if other := int(ours.Use) - len(have.Chains) - len(have.Sets); other > 0 {
				diff.Extra = append(diff.Extra, fmt.Sprintf("%d other objects in table %s %s (named counters, quotas, limits or flowtables)",
					other, iptables.NFTFamily, iptables.NFTTableName))
			}
		}
		st = iptables.State{
			Backend:  Name,
			Families: []iptables.FamilyState{{Family: iptables.FamilyInet, Rules: lines, Diff: diff}},
		}
		return nil
	})
	return st, err
}

// withTables opens a session, lists the tables and calls fn with both; the session is closed
// when fn returns.
func withTables(ctx context.Context, o options, fn func(s *session, tables []tableInfo) error) error {
	s, err := open(ctx, o)
	if err != nil {
		return err
	}
	defer s.close()
	tables, err := listTables(s.nl)
	if err != nil {
		return err
	}
	return fn(s, tables)
}

// readOurs reads our table back when tables lists it; both are nil when it does not exist.
func (s *session) readOurs(tables []tableInfo) (*tableInfo, *iptables.NFTTable, error) {
	ours := findTable(tables, inet, iptables.NFTTableName)
	if ours == nil {
		return nil, nil, nil
	}
	gc, err := s.google()
	if err != nil {
		return nil, nil, err
	}
	have, err := readTable(gc, ours.Comment)
	return ours, have, err
}

// Present lists the statements of our table, or nothing when it does not exist.
func (a *Applier) Present(ctx context.Context) ([]string, error) {
	var out []string
	err := withTables(ctx, a.opts, func(s *session, tables []tableInfo) error {
		_, have, err := s.readOurs(tables)
		if have != nil {
			out = have.Statements()
		}
		return err
	})
	return out, err
}

// Cleanup deletes our table. It succeeds when there is none.
func (a *Applier) Cleanup(ctx context.Context) error {
	return errclass.Netlink("nftables cleanup", withTables(ctx, a.opts, func(s *session, tables []tableInfo) error {
		if findTable(tables, inet, iptables.NFTTableName) == nil {
			return nil
		}
		var b batch
		b.add(unix.NFT_MSG_DELTABLE, 0, inet, []netlink.Attribute{{Type: unix.NFTA_TABLE_NAME, Data: cstr(iptables.NFTTableName)}},
			"delete table "+iptables.NFTTableName)
		if err := b.send(s.nl); err != nil && !errNotFound(err) {
			return err
		}
		return nil
	}))
}
