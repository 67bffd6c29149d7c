package localtailnet

import (
	"crypto/subtle"
	"net/http"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// FederatedIdentity is a trust of the tailnet's OAuth client in the identity tokens of one
// issuer, as Tailscale's workload identity federation configures it: a token signed by one of
// Keys, from Issuer, for Audience and about Subject, is exchanged for an API token of the
// client, which then needs no secret.
type FederatedIdentity struct {
	Issuer, Audience, Subject string
	Keys                      jose.JSONWebKeySet
}

// TrustIdentity makes the OAuth client accept identity tokens as fi describes, in place of any
// trust set before.
func (lt *LocalTailnet) TrustIdentity(fi FederatedIdentity) {
	lt.srv.mu.Lock()
	defer lt.srv.mu.Unlock()
	lt.srv.federated = &fi
}

// serveTokenExchange is the token exchange of workload identity federation: client_id and
// jwt (the identity token) in a form.
func (s *server) serveTokenExchange(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	if err := r.ParseForm(); err != nil {
		apiError(w, http.StatusBadRequest, "invalid form")
		return
	}
	s.mu.Lock()
	fi := s.federated
	s.mu.Unlock()
	if subtle.ConstantTimeCompare([]byte(r.PostForm.Get("client_id")), []byte(s.oauthID)) != 1 || fi == nil {
		apiError(w, http.StatusUnauthorized, "unknown client, or a client that trusts no identity tokens")
		return
	}
	tok, err := jwt.ParseSigned(r.PostForm.Get("jwt"), []jose.SignatureAlgorithm{jose.RS256, jose.ES256})
	if err != nil {
		apiError(w, http.StatusBadRequest, "the identity token is not a signed JWT")
		return
	}
	var claims jwt.Claims
	if err := tok.Claims(fi.Keys, &claims); err != nil {
		apiError(w, http.StatusUnauthorized, "the identity token's signature is not of the trusted issuer's keys")
		return
	}
	if err := claims.Validate(jwt.Expected{Issuer: fi.Issuer, Subject: fi.Subject, AnyAudience: jwt.Audience{fi.Audience}, Time: time.Now()}); err != nil {
		apiError(w, http.StatusUnauthorized, "the identity token does not match the client's trust: %v", err)
		return
	}
	s.issueToken(w)
}
