package iptables

// UID/GID exemptions: the traffic of the proxy's user and group, and of those to ignore, goes
// out as it is (its DNS in the direct zone, step_dns.go).

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

func (s ignoreOwnerStep) xtRules(out []XTRule, x XTRule, f Family) []XTRule {
	x.Comment = comment(s, "")
	return append(out, xtOwner(x, s.Owner, s.ID))
}

func (s ignoreOwnerStep) nftRules(w *nftWriter, cw *nftChainWriter, dir string) {
	cw.add(NFTRule{Comment: comment(s, ""), Matches: nftOwner(s.Owner, s.ID)})
}

// xtOwner is x matching sockets of the user (OwnerUID) or group (OwnerGID) id.
func xtOwner(x XTRule, o Owner, id uint32) XTRule {
	switch o {
	case OwnerUID:
		x.UIDOwner = &id
	case OwnerGID:
		x.GIDOwner = &id
	}
	return x
}

// nftOwner is the nftables match of xtOwner.
func nftOwner(o Owner, id uint32) []NFTMatch {
	switch o {
	case OwnerUID:
		return []NFTMatch{{Kind: NFTMatchSkUID, ID: id}}
	case OwnerGID:
		return []NFTMatch{{Kind: NFTMatchSkGID, ID: id}}
	}
	return nil
}
