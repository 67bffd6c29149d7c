// Package proxyprotoecho is a test backend behind a PROXY protocol relay: it answers what the
// header of each connection or datagram says, read with go-proxyproto's parser (another
// implementation than the relay's), as "v<version> <source> <destination> <payload>" (TCP: the
// payload's first line), or "no header: <error>".
package proxyprotoecho

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/pires/go-proxyproto"
)

// connTimeout bounds a TCP connection, longer than the stalls WireGuard's handshake retries
// can cause.
const connTimeout = 15 * time.Second

// ServeTCP answers each connection ln accepts until ln is closed.
func ServeTCP(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			c.SetDeadline(time.Now().Add(connTimeout))                   //nolint:errcheck // a read error follows
			_, _ = io.WriteString(c, Describe(bufio.NewReader(c), true)) // the client sees it missing
		}()
	}
}

// ServeUDP answers each datagram pc receives until pc is closed.
func ServeUDP(pc net.PacketConn) {
	buf := make([]byte, 64<<10)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		pc.WriteTo([]byte(Describe(bufio.NewReader(bytes.NewReader(buf[:n])), false)), from) //nolint:errcheck // the client retries
	}
}

// Describe reads a header and the payload after it (its first line, if line) from r.
func Describe(r *bufio.Reader, line bool) string {
	h, err := proxyproto.Read(r)
	if err != nil {
		return "no header: " + err.Error()
	}
	var payload []byte
	if line {
		s, _ := r.ReadString('\n')
		payload = bytes.TrimSuffix([]byte(s), []byte("\n"))
	} else {
		payload, _ = io.ReadAll(r)
	}
	return fmt.Sprintf("v%d %s %s %s", h.Version, h.SourceAddr, h.DestinationAddr, payload)
}
