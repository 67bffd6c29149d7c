//go:build conformance

package main

// The Gateway API conformance suite's UDP backend answers with whoami (make test-conformance).
import _ "github.com/coredns/coredns/plugin/whoami"
