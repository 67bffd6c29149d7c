package contract

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// ErrNoSupportedVersion is returned when a document exists only in versions the reader does not
// understand (or not at all).
var ErrNoSupportedVersion = errors.New("no supported schema version")

// ErrNoDocument is returned, besides ErrNoSupportedVersion, when the document is in no version
// at all: not written yet, rather than written for another build.
var ErrNoDocument = errors.New("no such document")

// codec stores a document of type T under one key per schema version.
type codec[T any] struct {
	name string // key prefix, e.g. "proxy-config"
	// encode holds the versions this side writes; decode the versions it reads.
	encode map[int]func(*T) ([]byte, error)
	decode map[int]func([]byte) (*T, error)
}

// key returns the storage key of version v, e.g. "proxy-config.v1.json".
func (c codec[T]) key(v int) string { return fmt.Sprintf("%s.v%d.json", c.name, v) }

// keyPatterns caches each document name's key pattern: readers match keys on every read, and
// compiling the pattern each time was a tenth of the operator's CPU with large groups.
var keyPatterns sync.Map // document name → *regexp.Regexp

func (c codec[T]) keyPattern() *regexp.Regexp {
	if re, ok := keyPatterns.Load(c.name); ok {
		return re.(*regexp.Regexp)
	}
	re := regexp.MustCompile(`^` + regexp.QuoteMeta(c.name) + `\.v([1-9][0-9]{0,5})\.json$`)
	keyPatterns.Store(c.name, re)
	return re
}

// errNotExpressible is returned by an encoder whose version cannot express the document.
var errNotExpressible = errors.New("not expressible in this version")

// onlyIf makes an older version's encoder skip documents that use newer features: a reader of
// that version then finds no version it understands and says so, rather than misreading.
func onlyIf[T any](expressible func(*T) bool, enc func(*T) ([]byte, error)) func(*T) ([]byte, error) {
	return func(doc *T) ([]byte, error) {
		if !expressible(doc) {
			return nil, errNotExpressible
		}
		return enc(doc)
	}
}

// Encode renders doc in the oldest version this side writes that can express it, and in the
// newest. The versions between would add nothing: a reader takes the newest version it
// understands, and one that stops between them reads the oldest, which says the same. A writer
// that patches rather than replaces must remove the keys of Keys that are not in the result.
func (c codec[T]) Encode(doc *T) (map[string][]byte, error) { return c.EncodeFrom(doc, 0) }

// EncodeFrom is Encode for a reader known to read version min or newer: the versions before
// min are not written.
func (c codec[T]) EncodeFrom(doc *T, min int) (map[string][]byte, error) {
	out := make(map[string][]byte, 2)
	versions := sortedDesc(c.encode)
	slices.Reverse(versions)
	newest := versions[len(versions)-1]
	versions = slices.DeleteFunc(versions, func(v int) bool { return v < min && v != newest })
	for i, v := range versions {
		b, err := c.encode[v](doc)
		if errors.Is(err, errNotExpressible) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("encoding %s: %w", c.key(v), err)
		}
		out[c.key(v)] = b
		if i < len(versions)-1 {
			if b, err = c.encode[newest](doc); err != nil {
				return nil, fmt.Errorf("encoding %s: %w", c.key(newest), err)
			}
			out[c.key(newest)] = b
		}
		break
	}
	return out, nil
}

// Newest is the newest version this build writes.
func (c codec[T]) Newest() int { return sortedDesc(c.encode)[0] }

// Keys lists the keys Encode writes, newest first.
func (c codec[T]) Keys() []string {
	var keys []string
	for _, v := range sortedDesc(c.encode) {
		keys = append(keys, c.key(v))
	}
	return keys
}

// Versions found in data for this document, newest first.
func (c codec[T]) found(data map[string][]byte) []int {
	re := c.keyPattern()
	var vs []int
	for k := range data {
		if m := re.FindStringSubmatch(k); m != nil {
			v, _ := strconv.Atoi(m[1])
			vs = append(vs, v)
		}
	}
	slices.Sort(vs)
	slices.Reverse(vs)
	return vs
}

// Present reports whether data holds the document in any version, readable here or not.
func (c codec[T]) Present(data map[string][]byte) bool { return len(c.found(data)) > 0 }

// Decode reads the newest version in data that this side understands and returns the document
// and its version. An error decoding that version is returned as is: falling back to an older
// version would hide a broken writer.
func (c codec[T]) Decode(data map[string][]byte) (*T, int, error) {
	found := c.found(data)
	for _, v := range found {
		dec, ok := c.decode[v]
		if !ok {
			continue
		}
		doc, err := dec(data[c.key(v)])
		if err != nil {
			return nil, v, fmt.Errorf("%s: %w", c.key(v), err)
		}
		return doc, v, nil
	}
	err := fmt.Errorf("%w for %s: found %s, this build reads %s", ErrNoSupportedVersion,
		c.name, versionList(found), versionList(sortedDesc(c.decode)))
	if len(found) == 0 {
		err = fmt.Errorf("%w (%w)", err, ErrNoDocument)
	}
	return nil, 0, err
}

// DecodeDir reads the document from a directory, such as a mounted Secret or ConfigMap volume.
func (c codec[T]) DecodeDir(dir string) (*T, int, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, 0, fmt.Errorf("reading %s directory: %w", c.name, err)
	}
	re := c.keyPattern()
	data := map[string][]byte{}
	for _, e := range entries {
		if !re.MatchString(e.Name()) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, 0, err
		}
		data[e.Name()] = b
	}
	return c.Decode(data)
}

func versionList(vs []int) string {
	if len(vs) == 0 {
		return "none"
	}
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = "v" + strconv.Itoa(v)
	}
	return strings.Join(s, ", ")
}

func sortedDesc[F any](m map[int]F) []int {
	var vs []int
	for v := range m {
		vs = append(vs, v)
	}
	slices.Sort(vs)
	slices.Reverse(vs)
	return vs
}

// jsonEncoder and jsonDecoder serve versions whose wire form is the Go type itself.
func jsonEncoder[T any](version int, setVersion func(*T, int)) func(*T) ([]byte, error) {
	return func(doc *T) ([]byte, error) {
		cp := *doc
		setVersion(&cp, version)
		return json.Marshal(&cp)
	}
}

func jsonDecoder[T any](version int, getVersion func(*T) int, validate func(*T) error) func([]byte) (*T, error) {
	return func(b []byte) (*T, error) {
		doc := new(T)
		if err := json.Unmarshal(b, doc); err != nil {
			return nil, fmt.Errorf("invalid JSON: %w", err)
		}
		if got := getVersion(doc); got != version {
			return nil, fmt.Errorf("document says version %d, stored as version %d", got, version)
		}
		if err := validate(doc); err != nil {
			return nil, err
		}
		return doc, nil
	}
}
