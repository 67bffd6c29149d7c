package clienthello

import (
	"crypto/tls"
	"io"
	"net"
	"testing"
)

// The name is read without a byte written to the client, and the replayed connection gives the
// handshake the whole ClientHello.
func TestServerNameAndReplay(t *testing.T) {
	for _, tc := range []struct{ sent, want string }{{"Web.Example.COM.", "web.example.com"}, {"", ""}} {
		client, server := net.Pipe()
		go func() {
			// The handshake fails: the other end only reads the ClientHello.
			_ = tls.Client(client, &tls.Config{ServerName: tc.sent, InsecureSkipVerify: true}).Handshake()
			client.Close()
		}()
		name, hello, err := ServerName(server)
		if err != nil || name != tc.want || len(hello) == 0 {
			t.Fatalf("sent %q: name %q, %d bytes, %v; want %q", tc.sent, name, len(hello), err, tc.want)
		}
		again, _, err := ServerName(Replay(server, hello))
		if err != nil || again != tc.want {
			t.Errorf("sent %q: replayed: %q, %v", tc.sent, again, err)
		}
		server.Close()
	}
	// Not TLS: an error, not a name.
	client, server := net.Pipe()
	go func() { io.WriteString(client, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); client.Close() }()
	if name, _, err := ServerName(server); err == nil {
		t.Errorf("plain HTTP read as a ClientHello naming %q", name)
	}
}
