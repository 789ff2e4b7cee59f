package iptables

// Reroute virtual interfaces: TCP arriving on a virtual machine's interfaces is its outbound
// traffic: the outbound steps that apply go first in the inbound chain, limited to them.

// ReroutePrefix starts the names of a rerouted interface's steps: the outbound step's name follows.
const ReroutePrefix = "reroute-"

// RerouteInterfacePrefix, then the interface, names the rule keeping TPROXY from it.
const RerouteInterfacePrefix = "reroute-interface-"

// reroutable is a step that applies to traffic from outside the pod's sockets.
type reroutable interface {
	Step
	// rerouted is the step limited to TCP arriving on iface: reroutedStep(s, iface).
	rerouted(iface string) Step
}

// reroutedStep is s limited to iface, holding the outbound lists.
func reroutedStep[S Step, P interface {
	*S
	common() *StepCommon
}](s S, iface string) Step {
	c := P(&s).common()
	c.Name, c.Arriving, c.Direction = ReroutePrefix+c.Name, iface, "outbound"
	return s
}

// common is the StepCommon a step embeds, for reroutedStep to change.
func (c *StepCommon) common() *StepCommon { return c }

// reroute puts first in the inbound chain, for each of the virtual machine's interfaces, the
// reroutable outbound steps: the VM's outbound traffic never meets the inbound steps.
func (r *Ruleset) reroute(in *PlanChain, outbound []Step) {
	var steps []Step
	for _, name := range r.RerouteInterfaces {
		for _, s := range outbound {
			if rs, ok := s.(reroutable); ok {
				steps = append(steps, rs.rerouted(name))
			}
		}
	}
	in.Steps = append(steps, in.Steps...)
}
