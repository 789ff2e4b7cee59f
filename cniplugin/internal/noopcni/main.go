// Command noopcni is a chained CNI plugin that does nothing but pass prevResult through. It is the
// baseline of the linkerd-cni benchmark: the cost of being one more plugin in the chain (a process
// start, config parsing, one result) without any pod lookup or rule writing. Not for production.
package main

import (
	"encoding/json"
	"errors"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
)

func add(args *skel.CmdArgs) error {
	conf, err := parse(args)
	if err != nil {
		return err
	}
	if conf.PrevResult == nil {
		return errors.New("noopcni: prevResult is required")
	}
	return types.PrintResult(conf.PrevResult, conf.CNIVersion)
}

func parse(args *skel.CmdArgs) (*types.PluginConf, error) {
	conf := &types.PluginConf{}
	if err := json.Unmarshal(args.StdinData, conf); err != nil {
		return nil, err
	}
	if err := version.ParsePrevResult(conf); err != nil {
		return nil, err
	}
	return conf, nil
}

func nothing(*skel.CmdArgs) error { return nil }

func main() {
	skel.PluginMainFuncs(skel.CNIFuncs{Add: add, Check: nothing, Del: nothing, GC: nothing, Status: nothing},
		version.All, "noopcni: passes prevResult through")
}
