// Command pause is the end-to-end node's sandbox image: the process that holds a pod's
// namespaces. It sleeps until SIGINT or SIGTERM and exits 0, so a sandbox stops at once. It
// reaps nothing because pods here do not share a PID namespace.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
}
