package iptables

// UID/GID exemptions: the traffic of the proxy's user and group, and of the users and groups to
// ignore, goes out as it is (and its DNS, in the direct zone; see step_dns.go).

import "strconv"

// Owner says which socket owner a step matches.
type Owner int

const (
	OwnerAny Owner = iota
	OwnerUID
	OwnerGID
)

// exemption is a user or group whose traffic goes out as it is: the proxy's, or one to ignore.
type exemption struct {
	name  string
	owner Owner
	id    uint32
}

func (r *Ruleset) exemptions() []exemption {
	var exempts []exemption
	if r.ProxyUID >= 0 {
		exempts = append(exempts, exemption{"proxy-user-id", OwnerUID, uint32(r.ProxyUID)})
	}
	if r.ProxyGID >= 0 {
		exempts = append(exempts, exemption{"proxy-group-id", OwnerGID, uint32(r.ProxyGID)})
	}
	for _, id := range r.IgnoreUIDs {
		exempts = append(exempts, exemption{"user-id-" + strconv.FormatUint(uint64(id), 10), OwnerUID, id})
	}
	for _, id := range r.IgnoreGIDs {
		exempts = append(exempts, exemption{"group-id-" + strconv.FormatUint(uint64(id), 10), OwnerGID, id})
	}
	return exempts
}

// ownerSteps are the outbound chain's steps for the exemptions.
func ownerSteps(exempts []exemption) []Step {
	var steps []Step
	for _, e := range exempts {
		steps = append(steps, ignoreOwnerStep{StepCommon{Name: "ignore-" + e.name}, e.owner, e.id})
	}
	return steps
}

// ignoreOwnerStep returns traffic of sockets owned by the user (OwnerUID) or group ID.
type ignoreOwnerStep struct {
	StepCommon
	Owner Owner
	ID    uint32
}

func (s ignoreOwnerStep) IsList() bool { return false }

func (s ignoreOwnerStep) xtRules(out []XTRule, x XTRule, f Family) []XTRule {
	if s.Owner == OwnerGID {
		x.GIDOwner = &s.ID
	} else {
		x.UIDOwner = &s.ID
	}
	x.Comment = comment(s, "")
	return append(out, x)
}

func (s ignoreOwnerStep) nftRules(w *nftWriter, cw *nftChainWriter, dir string) {
	kind := NFTMatchSkUID
	if s.Owner == OwnerGID {
		kind = NFTMatchSkGID
	}
	cw.add(NFTRule{Comment: comment(s, ""), Matches: []NFTMatch{{Kind: kind, ID: s.ID}}})
}
