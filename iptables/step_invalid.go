package iptables

// INVALID drop: inbound TCP that conntrack marks INVALID is dropped, not passed on unredirected.

// dropInvalidStep drops TCP that conntrack marks INVALID.
type dropInvalidStep struct{ StepCommon }

func dropInvalid() Step { return dropInvalidStep{StepCommon{Name: "drop-invalid"}} }

func (s dropInvalidStep) xtRules(out []XTRule, x XTRule, f Family) []XTRule {
	x.TCP, x.CTState, x.Target, x.Comment = true, CTStateInvalid, TargetDrop, comment(s, "")
	return append(out, x)
}

func (s dropInvalidStep) nftRules(w *nftWriter) {
	w.add(NFTRule{Comment: comment(s, ""), Verdict: NFTDrop,
		Matches: w.acting(NFTMatch{Kind: NFTMatchTCP}, NFTMatch{Kind: NFTMatchCTState, ID: NFTCTInvalid})})
}
