// Command certmanager runs cert-manager's own controllers (from the
// pinned module github.com/cert-manager/cert-manager, package
// pkg/controller) for kube-env: the ones a CA and a self-signed Issuer
// need to issue Certificates. cert-manager's own command
// (github.com/cert-manager/cert-manager/cmd/controller) is a module of its
// own that the Go module proxy does not serve, so this is its wiring, kept
// to what kube-env uses: the Certificate controllers (trigger, key manager,
// request manager, issuing, readiness, revision manager), the
// CertificateRequest approver and the CA and self-signed signers, and the
// Issuer and ClusterIssuer controllers with the CA and self-signed issuer
// types. No ACME, Vault, Venafi, webhook or CA injector.
//
// Flags: --kubeconfig (the identity it acts as) and
// --cluster-resource-namespace (where a ClusterIssuer's Secrets are read).
// It stops on SIGINT or SIGTERM.
package main

import (
	"context"
	"flag"
	"log"
	"os"
	"os/signal"
	"sort"
	"sync"
	"syscall"
	"time"

	controllerpkg "github.com/cert-manager/cert-manager/pkg/controller"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	_ "github.com/cert-manager/cert-manager/pkg/controller/clusterissuers"
	_ "github.com/cert-manager/cert-manager/pkg/controller/issuers"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "the kubeconfig of the identity it acts as")
	clusterNS := flag.String("cluster-resource-namespace", "cert-manager", "where ClusterIssuers' Secrets are read")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	opts := controllerpkg.ContextOptions{Kubeconfig: *kubeconfig}
	opts.ClusterResourceNamespace = *clusterNS
	// cert-manager's defaults for these (its controller's configuration).
	opts.KubernetesAPIQPS = 20
	opts.KubernetesAPIBurst = 50
	opts.CertificateRequestMinimumBackoffDuration = time.Second
	opts.CertificateRequestMaximumBackoffDuration = 32 * time.Hour
	factory, err := controllerpkg.NewContextFactory(ctx, opts)
	if err != nil {
		log.Fatalf("certmanager: %v", err)
	}
	known := controllerpkg.Known()
	names := make([]string, 0, len(known))
	for n := range known {
		names = append(names, n)
	}
	sort.Strings(names)
	// Made first: each registers the informers it needs with the factories,
	// which are started next.
	controllers := map[string]controllerpkg.Interface{}
	for _, n := range names {
		c, err := known[n](factory)
		if err != nil {
			log.Fatalf("certmanager: controller %s: %v", n, err)
		}
		controllers[n] = c
	}
	shared, err := factory.Build()
	if err != nil {
		log.Fatalf("certmanager: %v", err)
	}
	shared.KubeSharedInformerFactory.Start(ctx.Done())
	shared.SharedInformerFactory.Start(ctx.Done())
	var wg sync.WaitGroup
	for n, c := range controllers {
		wg.Go(func() {
			if err := c.Run(5, ctx); err != nil {
				log.Printf("certmanager: controller %s stopped: %v", n, err)
				stop()
			}
		})
	}
	log.Printf("certmanager: running %v", names)
	wg.Wait()
}
