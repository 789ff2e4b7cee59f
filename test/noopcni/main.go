// Command noopcni is a chained CNI plugin that does nothing but pass prevResult through. It is the
// baseline of the linkerd-cni benchmark: the cost of being one more plugin in the chain (a process
// start, config parsing, one result) without any pod lookup or rule writing. With "roundtrip" in
// its config (a UNIX socket path) it also sends its config there and reads one answer, as the
// plugin does with the node agent: the floor of a plugin that asks an agent. Not for production.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"

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
	var rt struct {
		Roundtrip string `json:"roundtrip"`
	}
	if err := json.Unmarshal(args.StdinData, &rt); err == nil && rt.Roundtrip != "" {
		if err := roundtrip(rt.Roundtrip, args.StdinData); err != nil {
			return err
		}
	}
	return types.PrintResult(conf.PrevResult, conf.CNIVersion)
}

// roundtrip is one request and its answer on a SOCK_SEQPACKET UNIX socket.
func roundtrip(path string, msg []byte) error {
	c, err := net.DialTimeout("unixpacket", path, time.Second)
	if err != nil {
		return fmt.Errorf("noopcni: %w", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write(msg); err != nil {
		return fmt.Errorf("noopcni: %w", err)
	}
	buf := make([]byte, 64<<10)
	if _, err := c.Read(buf); err != nil {
		return fmt.Errorf("noopcni: %w", err)
	}
	return nil
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
