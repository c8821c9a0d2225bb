// The pod sandbox's process: it holds the pod's namespaces and waits, as
// registry.k8s.io/pause does, ending on SIGINT or SIGTERM. Built locally because
// no registry can be reached; the node's containerd names it as sandbox_image.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	<-stop
}
