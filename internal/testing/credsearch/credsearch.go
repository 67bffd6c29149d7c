// Package credsearch looks for credentials where none may appear (logs, Events, object specs
// and status): as written, and base64-encoded at any alignment, as a Secret's data appears in
// a logged request body or a YAML dump.
package credsearch

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Needles are the credentials a search looks for, each with what it is.
type Needles struct {
	forms map[string]string // a form of a credential → what it is
}

// New returns an empty set of needles.
func New() *Needles { return &Needles{forms: map[string]string{}} }

// Add looks for secret as written and base64-encoded (standard and URL alphabets) at each of
// the three alignments it can take in a longer encoded text: the part of each encoding that
// depends on the secret's bytes alone.
func (n *Needles) Add(secret, what string) {
	if secret == "" {
		return
	}
	n.forms[secret] = what
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
		for k := range 3 {
			text := enc.EncodeToString(append(make([]byte, k), secret...))
			// Characters carry 6 bits: those wholly inside the secret's bits.
			from, to := (8*k+5)/6, 8*(k+len(secret))/6
			if to-from >= 4 {
				n.forms[text[from:to]] = what + fmt.Sprintf(" (base64 at offset %d)", k)
			}
		}
	}
}

// Len is how many forms are looked for.
func (n *Needles) Len() int { return len(n.forms) }

// Search returns, sorted, each form found and where: "what in where".
func (n *Needles) Search(haystacks map[string][]byte) []string {
	var hits []string
	for _, where := range slices.Sorted(maps.Keys(haystacks)) {
		for form, what := range n.forms {
			if bytes.Contains(haystacks[where], []byte(form)) {
				hits = append(hits, what+" in "+where)
			}
		}
	}
	slices.Sort(hits)
	return slices.Compact(hits)
}

// Planted is what the credential Plant writes is, among the needles.
const Planted = "the planted credential"

// SplitPlanted separates the hits of the planted credential from the others.
func SplitPlanted(hits []string) (planted, others []string) {
	for _, h := range hits {
		if strings.HasPrefix(h, Planted) {
			planted = append(planted, h)
		} else {
			others = append(others, h)
		}
	}
	return planted, others
}
