// Command registrar registers a CSI node plugin with the kubelet, as the
// upstream node-driver-registrar does, for kube-env's real node: the Go
// module proxy serves no version of node-driver-registrar, and the
// registration cannot be served by Lamina's plugin itself (the kubelet's
// registration client sends the socket's path as the HTTP/2 :authority,
// which the h2 crate under tonic refuses: hyperium/h2#487).
//
// It listens on --registration-socket (in the kubelet's plugins_registry
// directory), answers GetInfo with the driver's name and --kubelet-endpoint
// (the CSI socket as the kubelet sees it), logs the kubelet's
// NotifyRegistrationStatus, and removes its socket on SIGINT or SIGTERM.
package main

import (
	"context"
	"flag"
	"log"
	"net"
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

type server struct {
	registerapi.UnimplementedRegistrationServer
	driver, endpoint string
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
	if st.PluginRegistered {
		log.Printf("%s is registered with the kubelet", s.driver)
	} else {
		log.Printf("the kubelet refused %s: %s", s.driver, st.Error)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

func main() {
	driver := flag.String("driver-name", "lamina.csi.io", "the CSI driver's name")
	endpoint := flag.String("kubelet-endpoint", "", "the CSI socket's path as the kubelet sees it")
	socket := flag.String("registration-socket", "", "where to listen: DIR/plugins_registry/DRIVER-reg.sock")
	flag.Parse()
	if *endpoint == "" || *socket == "" {
		log.Fatal("--kubelet-endpoint and --registration-socket are required")
	}
	if err := os.Remove(*socket); err != nil && !os.IsNotExist(err) {
		log.Fatal(err)
	}
	l, err := net.Listen("unix", *socket)
	if err != nil {
		log.Fatal(err)
	}
	g := grpc.NewServer()
	registerapi.RegisterRegistrationServer(g, &server{driver: *driver, endpoint: *endpoint})
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
