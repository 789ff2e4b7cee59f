// Package docexamples runs the command examples of the documentation and compares their output
// with what the documentation shows, so that a page cannot drift from the programs.
//
// A fenced block preceded by a marker comment is an example that runs:
//
//	<!-- run: netns=/run/netns/pod setup="proxy-init --netns /run/netns/pod -p 4143 -o 4140" exit=2 -->
//
// Its lines starting with "$ " are commands (a line ending in " \" continues on the next), and
// the lines after each, up to the next command, are its output, standard error and standard
// output together. In the output, "..." stands for any text within a line, and a line of only
// "..." for any number of lines; timestamps, durations and the ephemeral port of a connection
// are compared as "...". Each block runs in a fresh network namespace the test creates (the
// netns path, as the page writes it, names it in the commands and the output), after its setup
// commands, not shown; every command must exit 0, or the code exit gives. Commands run proxy-init
// as `make build` builds it. A block marked `<!-- run: of="make demo" -->` is an excerpt of what
// `make demo` (hack/demo.sh) prints instead, found in its output.
//
// It is all test, and runs as root (it writes rules), skipping otherwise.
//
// # Examples
//
// The marked examples today: proxy-init.md's apply, --simulate, show and exit-2 examples,
// troubleshooting.md's for Linkerd's defaults, README's `make demo` excerpt. Mark a new example
// that can run in a namespace the same way.
package docexamples
