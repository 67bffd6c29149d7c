package kit

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/acmebudget"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/docstest"
)

// reasonDecls parses the non-test files of every controller package and returns, per file
// (relative to internal/controller), the values of the constants named Reason*.
func reasonDecls(t *testing.T) map[string]map[string]string {
	t.Helper()
	// Reasons this package takes from others, by the expression that names them.
	imported := map[string]string{
		"acmebudget.ReasonDomainLimit": acmebudget.ReasonDomainLimit,
		"acmebudget.ReasonNameLimit":   acmebudget.ReasonNameLimit,
	}
	fset := token.NewFileSet()
	root, err := filepath.Glob("../*.go")
	if err != nil {
		t.Fatal(err)
	}
	subs, err := filepath.Glob("../*/*.go")
	if err != nil {
		t.Fatal(err)
	}
	files := append(root, subs...)
	out := map[string]map[string]string{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, id := range vs.Names {
					if !strings.HasPrefix(id.Name, "Reason") {
						continue
					}
					var v string
					switch e := vs.Values[i].(type) {
					case *ast.BasicLit:
						v, _ = strconv.Unquote(e.Value)
					case *ast.SelectorExpr:
						expr := e.X.(*ast.Ident).Name + "." + e.Sel.Name
						if v = imported[expr]; v == "" {
							t.Fatalf("%s: %s = %s: add it to the imported reasons of this test", name, id.Name, expr)
						}
					default:
						t.Fatalf("%s: %s is not a string literal", name, id.Name)
					}
					rel := strings.TrimPrefix(name, "../")
					if out[rel] == nil {
						out[rel] = map[string]string{}
					}
					out[rel][id.Name] = v
				}
			}
		}
	}
	return out
}

// documentedReasons reads the reasons tabled in docs/reasons.md: rows that start with a
// reason in backquotes.
func documentedReasons(t *testing.T) []string {
	t.Helper()
	out, err := docstest.Reasons()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestReasonsAreDeclaredOnceAndDocumented(t *testing.T) {
	decls := reasonDecls(t)
	for file, consts := range decls {
		if file != "kit/reasons.go" {
			t.Errorf("%s declares %v: every reason belongs in reasons.go", file, consts)
		}
	}
	byValue := map[string]string{}
	for name, v := range decls["kit/reasons.go"] {
		if other, dup := byValue[v]; dup {
			t.Errorf("%s and %s are both %q: one reason, one constant", name, other, v)
		}
		byValue[v] = name
	}
	documented := documentedReasons(t)
	if len(documented) < 10 {
		t.Fatalf("docs/reasons.md lists %d reasons; the table was not read", len(documented))
	}
	for _, r := range documented {
		if _, ok := byValue[r]; !ok {
			t.Errorf("docs/reasons.md lists %s, which the operator does not give", r)
		}
	}
	for v, name := range byValue {
		if !slices.Contains(documented, v) {
			t.Errorf("%s (%s) is not in docs/reasons.md", v, name)
		}
	}
}

// Reasons the other docs name in backquotes, where they describe what users see, are reasons the
// operator gives, the proxy reports or the control plane answers.
func TestDocsNameOnlyKnownReasons(t *testing.T) {
	known := documentedReasons(t)
	// The proxy's certificate reasons (state key certificates) and the control plane's reasons
	// carried in TailnetAPIFailed messages are documented beside them.
	known = append(known, contract.CertReasonIssuanceHeld, contract.CertReasonIssuanceFailed, contract.CertReasonSecretInvalid,
		contract.CertReasonWaiting, tailnet.ReasonUnauthorized, tailnet.ReasonForbidden, tailnet.ReasonTagsNotPermitted,
		tailnet.ReasonNotFound, tailnet.ReasonRateLimited, tailnet.ReasonUnavailable, tailnet.ReasonInvalidRequest,
		tailnet.ReasonCredentialsUnavailable,
		// and the conditions they are reasons of.
		ConditionProxyReady, ConditionIngressSvcValid, ConditionIngressSvcConfigured,
		tsv1alpha1.ProxyGroupReady, tsv1alpha1.ProxyGroupAvailable, tsv1alpha1.ProxyClassReady)
	// A backquoted word in a list of reasons: CamelCase, after "reason" or an Event, in docs.
	word := regexp.MustCompile("`([A-Z][a-z]+(?:[A-Z][a-z0-9]*)+)`")
	for _, doc := range []string{"ingress.md", "ha.md", "certificates.md"} {
		b, err := docstest.Read(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, para := range strings.Split(string(b), "\n\n") {
			if !regexp.MustCompile(`(?i)reason|event`).MatchString(para) {
				continue
			}
			for _, m := range word.FindAllStringSubmatch(para, -1) {
				if !slices.Contains(known, m[1]) && !notAReason[m[1]] && !strings.HasPrefix(m[1], "Test") {
					t.Errorf("docs/%s names %s as a reason; the operator has no such reason", doc, m[1])
				}
			}
		}
	}
}

// Backquoted CamelCase words of the docs that are not reasons (besides the names of tests).
var notAReason = map[string]bool{"ImplementationSpecific": true}
