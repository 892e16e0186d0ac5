// Command registrar registers a CSI node plugin with the kubelet, as the
// upstream node-driver-registrar does, for kube-env's real node: the Go
// module proxy serves no version of node-driver-registrar, and the
// registration cannot be served by Lamina's plugin itself (the kubelet's
// registration client sends the socket's path as the HTTP/2 :authority,
// which the h2 crate under tonic refuses: hyperium/h2#487).
//
// It listens on a registration socket in the kubelet's plugins_registry
// directory, answers GetInfo with the driver's name and the CSI socket's
// path as the kubelet sees it, logs the kubelet's NotifyRegistrationStatus,
// and removes its socket on SIGINT or SIGTERM.
//
// Two ways to run it:
//   - on the host, beside a plugin kube-env starts: --driver-name,
//     --kubelet-endpoint and --registration-socket;
//   - as the chart's node-driver-registrar container, with that program's
//     flags (the chart's own arguments): --csi-address (the plugin's socket
//     in the container; the driver's name is asked of it with GetPluginInfo,
//     as node-driver-registrar does), --kubelet-registration-path,
//     --plugin-registration-path (default /registration) and --http-endpoint,
//     which answers /healthz with 200 once the kubelet has registered the
//     plugin.
package main

import (
	"context"
	"flag"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

type server struct {
	registerapi.UnimplementedRegistrationServer
	driver, endpoint string
	registered       atomic.Bool
}

func (s *server) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	log.Printf("the kubelet asked for %s's info", s.driver)
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              s.driver,
		Endpoint:          s.endpoint,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

func (s *server) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	s.registered.Store(st.PluginRegistered)
	if st.PluginRegistered {
		log.Printf("%s is registered with the kubelet", s.driver)
	} else {
		log.Printf("the kubelet refused %s: %s", s.driver, st.Error)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// driverName asks the plugin at address (unix://PATH or PATH) its name,
// waiting for it to answer as long as it takes: the plugin may start after
// this container.
func driverName(address string) string {
	target := address
	if filepath.IsAbs(address) {
		target = "unix://" + address
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatalf("--csi-address %s: %v", address, err)
	}
	defer conn.Close()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		info, err := csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
		cancel()
		if err == nil && info.GetName() != "" {
			return info.GetName()
		}
		log.Printf("waiting for the plugin at %s to answer GetPluginInfo: %v", address, err)
		time.Sleep(time.Second)
	}
}

func main() {
	driver := flag.String("driver-name", "lamina.csi.io", "the CSI driver's name (host mode)")
	endpoint := flag.String("kubelet-endpoint", "", "the CSI socket's path as the kubelet sees it (host mode)")
	socket := flag.String("registration-socket", "", "where to listen: DIR/plugins_registry/DRIVER-reg.sock (host mode)")
	csiAddress := flag.String("csi-address", "", "the plugin's socket in this container (node-driver-registrar's flag)")
	kubeletPath := flag.String("kubelet-registration-path", "", "the plugin's socket as the kubelet sees it (node-driver-registrar's flag)")
	registrationDir := flag.String("plugin-registration-path", "/registration", "the kubelet's plugins_registry directory in this container")
	httpEndpoint := flag.String("http-endpoint", "", "HOST:PORT answering /healthz (node-driver-registrar's flag)")
	flag.Parse()
	if *csiAddress != "" {
		if *kubeletPath == "" {
			log.Fatal("--csi-address needs --kubelet-registration-path")
		}
		*driver = driverName(*csiAddress)
		*endpoint = *kubeletPath
		*socket = filepath.Join(*registrationDir, *driver+"-reg.sock")
	}
	if *endpoint == "" || *socket == "" {
		log.Fatal("--kubelet-endpoint and --registration-socket, or --csi-address and --kubelet-registration-path, are required")
	}
	if err := os.Remove(*socket); err != nil && !os.IsNotExist(err) {
		log.Fatal(err)
	}
	l, err := net.Listen("unix", *socket)
	if err != nil {
		log.Fatal(err)
	}
	g := grpc.NewServer()
	srv := &server{driver: *driver, endpoint: *endpoint}
	registerapi.RegisterRegistrationServer(g, srv)
	if *httpEndpoint != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
			if !srv.registered.Load() {
				http.Error(w, "not registered with the kubelet yet", http.StatusServiceUnavailable)
				return
			}
			w.Write([]byte("ok"))
		})
		go func() { log.Fatal(http.ListenAndServe(*httpEndpoint, mux)) }()
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-stop
		g.Stop()
	}()
	log.Printf("serving %s's registration on %s", *driver, *socket)
	if err := g.Serve(l); err != nil {
		log.Print(err)
	}
	os.Remove(*socket)
}
