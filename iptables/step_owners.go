package iptables

// UID/GID exemptions: the traffic of the proxy's user and group, and of those to ignore, goes
// out as it is (its DNS in the direct zone, step_dns.go).

import "strconv"

// exemption is a user or group whose traffic goes out as it is: the proxy's, or one to ignore.
// The zero exemption matches every socket owner.
type exemption struct {
	name     string
	uid, gid *uint32 // the socket owner matched: -m owner --uid-owner or --gid-owner
}

func (r *Ruleset) exemptions() []exemption {
	var exempts []exemption
	if r.ProxyUID >= 0 {
		exempts = append(exempts, exemption{"proxy-user-id", new(uint32(r.ProxyUID)), nil})
	}
	if r.ProxyGID >= 0 {
		exempts = append(exempts, exemption{"proxy-group-id", nil, new(uint32(r.ProxyGID))})
	}
	for _, v := range r.IgnoreUIDs {
		exempts = append(exempts, exemption{"user-id-" + strconv.FormatUint(uint64(v), 10), &v, nil})
	}
	for _, v := range r.IgnoreGIDs {
		exempts = append(exempts, exemption{"group-id-" + strconv.FormatUint(uint64(v), 10), nil, &v})
	}
	return exempts
}

// ownerSteps are the outbound chain's steps for the exemptions.
func ownerSteps(exempts []exemption) []Step {
	var steps []Step
	for _, e := range exempts {
		steps = append(steps, ignoreOwnerStep{StepCommon{Name: "ignore-" + e.name}, e})
	}
	return steps
}

// ignoreOwnerStep returns traffic of sockets owned by the exemption's user or group.
type ignoreOwnerStep struct {
	StepCommon
	exemption
}

func (s ignoreOwnerStep) xtRules(out []XTRule, x XTRule, f Family) []XTRule {
	x.Comment, x.UIDOwner, x.GIDOwner = comment(s, ""), s.uid, s.gid
	return append(out, x)
}

func (s ignoreOwnerStep) nftRules(w *nftWriter) {
	w.add(NFTRule{Comment: comment(s, ""), Matches: s.nftMatches()})
}

// nftMatches is the nftables match of the exemption's owner; none for the zero exemption.
func (e exemption) nftMatches() []NFTMatch {
	switch {
	case e.uid != nil:
		return []NFTMatch{{Kind: NFTMatchSkUID, ID: *e.uid}}
	case e.gid != nil:
		return []NFTMatch{{Kind: NFTMatchSkGID, ID: *e.gid}}
	}
	return nil
}
