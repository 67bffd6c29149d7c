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
// nothing runs here (there is no kubelet for workloads). It answers netexec's /echo?msg= and
// /header?key=, which the e2e suite uses, and greets at every other path.
func backendHandler(name string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.URL.Query().Get("msg"))
	})
	mux.HandleFunc("/header", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Header.Get(r.URL.Query().Get("key")))
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

// udpAnswer answers netexec's UDP command "echo <text>".
func udpAnswer(req string) string {
	if text, ok := strings.CutPrefix(strings.TrimSpace(req), "echo "); ok {
		return text
	}
	return "unknown command: " + req
}

// serveUDP answers from the address each datagram was sent to: the socket listens on every
// ClusterIP of the range at once, and a reply from another source would not match the proxy's
// DNAT connection.
func serveUDP(pc net.PacketConn) {
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
		p.WriteTo([]byte(udpAnswer(string(buf[:n]))), reply, from) //nolint:errcheck // the client retries
	}
}
