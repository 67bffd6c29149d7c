package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"

	"golang.org/x/net/ipv4"
)

// Ports the cluster-network backend answers on: those of the sample Service hello-l3.
const (
	backendTCPPort = 80
	backendUDPPort = 8081
)

// backendHandler stands in for the Pods of config/samples/backend.yaml (agnhost netexec), which
// nothing runs here (there is no kubelet for workloads). It answers the part of netexec's HTTP
// API that the demo and the e2e suite use.
func backendHandler(name string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.URL.Query().Get("msg"))
	})
	mux.HandleFunc("/hostname", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, name)
	})
	mux.HandleFunc("/clientip", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.RemoteAddr)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if login := r.Header.Get("Tailscale-User-Login"); login != "" {
			fmt.Fprintf(w, "hello, %s, from %s (path %s)\n", login, name, r.URL.Path)
			return
		}
		fmt.Fprintf(w, "hello from %s (path %s)\n", name, r.URL.Path)
	})
	return mux
}

// udpAnswer answers netexec's UDP commands "echo <text>" and "hostname".
func udpAnswer(req, name string) string {
	req = strings.TrimSpace(req)
	if text, ok := strings.CutPrefix(req, "echo "); ok {
		return text
	}
	if req == "hostname" {
		return name
	}
	return "unknown command: " + req
}

// serveUDP answers from the address each datagram was sent to: the socket listens on every
// ClusterIP of the range at once, and a reply from another source would not match the proxy's
// DNAT connection.
func serveUDP(pc net.PacketConn, name string) {
	p := ipv4.NewPacketConn(pc)
	if err := p.SetControlMessage(ipv4.FlagDst, true); err != nil {
		pc.Close()
		return
	}
	buf := make([]byte, 1500)
	for {
		n, cm, from, err := p.ReadFrom(buf)
		if err != nil {
			return
		}
		var reply *ipv4.ControlMessage
		if cm != nil {
			reply = &ipv4.ControlMessage{Src: cm.Dst}
		}
		p.WriteTo([]byte(udpAnswer(string(buf[:n]), name)), reply, from) //nolint:errcheck // the client retries
	}
}
