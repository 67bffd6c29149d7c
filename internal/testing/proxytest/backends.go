package proxytest

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// EchoReply is what an EchoPod answers: the request as it saw it.
type EchoReply struct {
	Service string      `json:"service"`
	Pod     string      `json:"pod"`
	PodAddr string      `json:"podAddr"`
	Method  string      `json:"method"`
	Path    string      `json:"path"`
	Host    string      `json:"host"`
	Proto   string      `json:"proto"`
	Headers http.Header `json:"headers"`
	Body    string      `json:"body,omitempty"`
}

// EchoPod is an HTTP server standing in for one Pod of a Service, as the conformance suite's
// echo server: it answers every request with an EchoReply in JSON.
type EchoPod struct {
	Service, Name string
	Addr          string // ip:port it listens on
	Served        atomic.Int64
	srv           *http.Server
}

// StartEchoPod listens on addr ("127.0.0.1:0" for any port) until the test ends or Shutdown.
func StartEchoPod(t testing.TB, service, name, addr string) (*EchoPod, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	p := &EchoPod{Service: service, Name: name, Addr: ln.Addr().String()}
	p.srv = &http.Server{Handler: http.HandlerFunc(p.serve), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = p.srv.Serve(ln) }() // ErrServerClosed once shut down
	t.Cleanup(func() { _ = p.srv.Close() })
	return p, nil
}

func (p *EchoPod) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	p.Served.Add(1)
	w.Header().Set("Content-Type", "application/json")
	// A failed write is the client's to see.
	_ = json.NewEncoder(w).Encode(EchoReply{Service: p.Service, Pod: p.Name, PodAddr: p.Addr, Method: r.Method,
		Path: r.URL.Path, Host: r.Host, Proto: r.Proto, Headers: r.Header, Body: string(body)})
}

// Shutdown stops the pod as a terminating Pod's server does: it stops accepting, closes idle
// connections and waits for the requests in flight.
func (p *EchoPod) Shutdown(ctx context.Context) error { return p.srv.Shutdown(ctx) }

// ClusterIP stands in for kube-proxy in front of a Service's Pods: it forwards each TCP
// connection, not each request, to the next Pod in turn.
type ClusterIP struct {
	Addr string
	ln   net.Listener

	mu   sync.Mutex
	pods []string
	next int
}

// StartClusterIP listens on addr and forwards to pods until the test ends.
func StartClusterIP(t testing.TB, addr string, pods []string) (*ClusterIP, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	c := &ClusterIP{Addr: ln.Addr().String(), ln: ln, pods: pods}
	t.Cleanup(func() { ln.Close() })
	go c.accept()
	return c, nil
}

// SetPods replaces the Pods new connections go to.
func (c *ClusterIP) SetPods(pods []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pods = pods
}

func (c *ClusterIP) pick() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.pods) == 0 {
		return ""
	}
	c.next++
	return c.pods[c.next%len(c.pods)]
}

func (c *ClusterIP) accept() {
	for {
		in, err := c.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue
		}
		go func() {
			defer in.Close()
			pod := c.pick()
			if pod == "" {
				return
			}
			out, err := net.DialTimeout("tcp", pod, 5*time.Second)
			if err != nil {
				return
			}
			defer out.Close()
			// Either side gone ends the connection; no one to tell.
			done := make(chan struct{}, 2)
			go func() { _, _ = io.Copy(out, in); _ = out.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
			go func() { _, _ = io.Copy(in, out); _ = in.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
			<-done
			<-done
		}()
	}
}
