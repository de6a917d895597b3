// CoreDNS with only the plugins the local cluster uses: serving cluster.local from the API server
// (kubernetes) and forwarding everything else to the host's resolver. Importing core/plugin would
// compile every cloud backend CoreDNS ships, several minutes more on two cores for nothing we use.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// Execution order of the plugins in a server block (the order CoreDNS itself uses for these).
func init() {
	dnsserver.Directives = []string{
		"bind", "health", "ready", "errors", "log", "cache", "loadbalance", "kubernetes", "forward",
	}
}

func main() { coremain.Run() }
