// Package clienthello reads the server name of a TLS connection before it is handed on: a
// Funnel relay and a proxy both route by it, and the TLS handshake happens after, elsewhere.
package clienthello

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strings"
)

// errRead ends the handshake ServerName starts, once the ClientHello is read.
var errRead = errors.New("ClientHello read")

// ServerName reads a TLS ClientHello from c and returns its server name (lowercase, without a
// trailing dot; "" if it names none) and the bytes read, which must reach whoever does the
// handshake before anything else: see Replay.
func ServerName(c net.Conn) (string, []byte, error) {
	var hello bytes.Buffer
	var name string
	err := tls.Server(readOnlyConn{Conn: c, r: io.TeeReader(c, &hello)}, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			name = h.ServerName
			return nil, errRead
		},
	}).Handshake()
	if !errors.Is(err, errRead) {
		return "", nil, err
	}
	return strings.ToLower(strings.TrimSuffix(name, ".")), hello.Bytes(), nil
}

// Replay returns c with the bytes ServerName read put back in front.
func Replay(c net.Conn, hello []byte) net.Conn {
	return &replayConn{Conn: c, r: io.MultiReader(bytes.NewReader(hello), c)}
}

type replayConn struct {
	net.Conn
	r io.Reader
}

func (c *replayConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// readOnlyConn lets the TLS stack read a ClientHello without writing anything to the client.
type readOnlyConn struct {
	net.Conn
	r io.Reader
}

func (c readOnlyConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c readOnlyConn) Write(p []byte) (int, error) { return 0, io.ErrClosedPipe }
