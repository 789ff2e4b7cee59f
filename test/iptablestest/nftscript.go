package iptablestest

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/kubemesh/proxy-init/iptables"
)

// NFTScript renders t as the `nft -f` script that replaces our table atomically: the first line
// creates the table if it is missing, so that the delete that follows cannot fail, and the whole
// file is one transaction. Running it twice leaves the same table. Tests hand it to nft to compare
// what nft writes with what our netlink writer writes.
func NFTScript(t iptables.NFTTable) string {
	var b strings.Builder
	tbl := iptables.NFTFamily + " " + iptables.NFTTableName
	fmt.Fprintf(&b, "table %s\ndelete table %s\ntable %s {\n", tbl, tbl, tbl)
	fmt.Fprintf(&b, "\tcomment %s\n", strconv.Quote(t.Comment))
	for _, s := range t.Sets {
		fmt.Fprintf(&b, "\n\tset %s {\n\t\ttype %s\n\t\tflags %s\n\t\telements = { %s }\n\t}\n",
			s.Name, s.Type, s.FlagList(), strings.Join(s.ElementStrings(), ", "))
	}
	for _, c := range t.Chains {
		fmt.Fprintf(&b, "\n\tchain %s {\n\t\t%s\n", c.Name, c.Header())
		for _, r := range c.Rules {
			fmt.Fprintf(&b, "\t\t%s\n", r)
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String()
}
