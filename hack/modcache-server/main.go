// Command modcache-server serves this machine's Go module cache as a module proxy (the cache's
// download directory has the GOPROXY layout), so that image builds get their modules from here and
// need no network of their own (hack/docker-build.sh).
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve on")
	portFile := flag.String("port-file", "", "file to write the chosen port to once serving")
	flag.Parse()

	out, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		log.Fatalf("go env GOMODCACHE: %v", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "cache", "download")
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	if *portFile != "" {
		port := ln.Addr().(*net.TCPAddr).Port
		if err := os.WriteFile(*portFile, []byte(fmt.Sprint(port)), 0o644); err != nil {
			log.Fatal(err)
		}
	}
	log.Fatal(http.Serve(ln, http.FileServer(http.Dir(dir))))
}
