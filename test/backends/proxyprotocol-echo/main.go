// Command proxyprotocol-echo is the e2e suite's backend behind a PROXY protocol relay
// (package proxyprotoecho), on one port, TCP and UDP.
package main

import (
	"flag"
	"fmt"
	"log"
	"net"

	"github.com/tsingress/tsingress/internal/testing/proxyprotoecho"
)

func main() {
	port := flag.Int("port", 7000, "TCP and UDP port to answer on")
	flag.Parse()
	addr := fmt.Sprintf(":%d", *port)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		log.Fatal(err)
	}
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("answering PROXY protocol headers on %s, TCP and UDP", addr)
	go proxyprotoecho.ServeUDP(pc)
	proxyprotoecho.ServeTCP(ln)
}
