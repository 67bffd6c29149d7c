package tailnet

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"
)

// fileCredentials is an oauth2.TokenSource for an OAuth client whose ID and secret (or an
// identity token to exchange) live in files. The files are read on every call, so a rotated secret (a Secret volume updated in
// place) is picked up without a restart; the token is reused until it expires, the
// credentials change, or the API rejects it.
type fileCredentials struct {
	idFile, secretFile string
	// idTokenFile, when set, holds an identity token exchanged at exchangeURL in place of
	// the client secret (workload identity federation).
	idTokenFile           string
	clientID              []byte // the ID itself, when there is no idFile
	tokenURL, exchangeURL string
	httpClient            *http.Client
	log                   *slog.Logger

	mu             sync.Mutex
	id, secret     []byte
	tok            *oauth2.Token
	tokenFetchedAt time.Time
}

func (f *fileCredentials) read() (id, secret []byte, err error) {
	id = f.clientID
	if f.idFile != "" {
		if id, err = readTrimmed(f.idFile); err != nil {
			return nil, nil, err
		}
	}
	secret, err = readTrimmed(cmp.Or(f.idTokenFile, f.secretFile))
	if err != nil {
		return nil, nil, err
	}
	return id, secret, nil
}

func readTrimmed(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		// The os error names the path and the failure, never the content.
		return nil, &Error{Op: "read OAuth credentials", Reason: ReasonCredentialsUnavailable, cause: err}
	}
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return nil, &Error{Op: "read OAuth credentials", Reason: ReasonCredentialsUnavailable, Message: path + " is empty"}
	}
	return b, nil
}

// Token implements oauth2.TokenSource.
func (f *fileCredentials) Token() (*oauth2.Token, error) {
	id, secret, err := f.read()
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	same := bytes.Equal(id, f.id) && bytes.Equal(secret, f.secret)
	if same && f.tok.Valid() {
		return f.tok, nil
	}
	if !same && f.id != nil {
		f.log.Info("OAuth client credentials changed on disk; fetching a new token")
	}
	fetch := f.clientCredentials
	if f.idTokenFile != "" {
		fetch = f.exchange
	}
	tok, err := fetch(id, secret)
	if err != nil {
		return nil, err
	}
	f.id, f.secret, f.tok, f.tokenFetchedAt = id, secret, tok, time.Now()
	f.log.Debug("fetched OAuth access token", "expiry", tok.Expiry, "federated", f.idTokenFile != "")
	return tok, nil
}

// clientCredentials fetches a token with the OAuth client's ID and secret.
func (f *fileCredentials) clientCredentials(id, secret []byte) (*oauth2.Token, error) {
	cfg := clientcredentials.Config{
		ClientID:     string(id),
		ClientSecret: string(secret),
		TokenURL:     f.tokenURL,
		AuthStyle:    oauth2.AuthStyleInParams,
	}
	// oauth2.TokenSource has no context; bound the fetch instead.
	ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), oauth2.HTTPClient, f.httpClient), 30*time.Second)
	defer cancel()
	tok, err := cfg.Token(ctx)
	if err != nil {
		return nil, tokenError(err)
	}
	return tok, nil
}

// exchange trades an identity token for an API token of client id, as Tailscale's workload
// identity federation does. Neither the token nor the response body is kept in an error.
func (f *fileCredentials) exchange(id, idToken []byte) (*oauth2.Token, error) {
	const op = "exchange the identity token for an API token"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	form := url.Values{"client_id": {string(id)}, "jwt": {string(idToken)}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.exchangeURL, strings.NewReader(form.Encode()))
	if err != nil {
		return nil, &Error{Op: op, Reason: ReasonInvalidRequest, cause: err}
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	res, err := f.httpClient.Do(req)
	if err != nil {
		return nil, &Error{Op: op, Reason: ReasonUnavailable, cause: err}
	}
	defer res.Body.Close()
	if res.StatusCode >= http.StatusBadRequest {
		_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
		e := &Error{Op: op, Status: res.StatusCode, Message: http.StatusText(res.StatusCode),
			RetryAfter: parseRetryAfter(res.Header.Get("Retry-After"), time.Now())}
		switch res.StatusCode {
		case http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden:
			e.Reason = ReasonUnauthorized
		default:
			e.Reason = reasonForStatus(res.StatusCode, e.Message)
		}
		return nil, e
	}
	var body struct {
		AccessToken string `json:"access_token"`
		TokenType   string `json:"token_type"`
		ExpiresIn   int64  `json:"expires_in"`
	}
	if err := json.NewDecoder(io.LimitReader(res.Body, 64<<10)).Decode(&body); err != nil || body.AccessToken == "" {
		return nil, &Error{Op: op, Reason: ReasonUnavailable, Message: "the API answered with no access token"}
	}
	return &oauth2.Token{AccessToken: body.AccessToken, TokenType: body.TokenType,
		Expiry: time.Now().Add(time.Duration(body.ExpiresIn) * time.Second)}, nil
}

// invalidate drops the cached token after the API refused it, so the next call fetches anew.
func (f *fileCredentials) invalidate(issuedBefore time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.tokenFetchedAt.Before(issuedBefore) {
		f.tok = nil
	}
}

// tokenError turns a token endpoint failure into an *Error without keeping the response body.
func tokenError(err error) error {
	const op = "fetch OAuth token"
	if re, ok := errors.AsType[*oauth2.RetrieveError](err); ok {
		e := &Error{Op: op, Message: re.ErrorCode}
		if re.ErrorDescription != "" {
			e.Message = fmt.Sprintf("%s: %s", re.ErrorCode, re.ErrorDescription)
		}
		if re.Response != nil {
			e.Status = re.Response.StatusCode
			e.RetryAfter = parseRetryAfter(re.Response.Header.Get("Retry-After"), time.Now())
		}
		switch {
		case re.ErrorCode == "invalid_client" || re.ErrorCode == "unauthorized_client":
			e.Reason = ReasonUnauthorized
		case e.Status != 0:
			e.Reason = reasonForStatus(e.Status, e.Message)
		default:
			e.Reason = ReasonUnavailable
		}
		return e
	}
	return &Error{Op: op, Reason: ReasonUnavailable, cause: err}
}
