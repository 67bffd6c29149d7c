package contract

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math/bits"
)

// A ProxyGroup's documents may be spread over several ConfigMaps ("shards"), so that no object
// grows with the number of services on the group. Shard 0 is the group ConfigMap the replicas
// are given (`<pg>-ingress-config`); when there is more than one, it holds a GroupShards
// document saying how many, and shard i > 0 is the ConfigMap named ShardName(main, i). A
// service's entries (Serve, DNAT) are in one shard: operators up to 2026-12 put them in shard
// ShardOf(service, count); later ones leave an entry where it is and put a new service in the
// first shard with room, so that adding services rewrites one shard, not all. Readers take the
// union of every shard's documents, once they have read every shard.
//
// The count only grows, by one shard at a time. When entries move (a shard split by hash, or
// relieved of entries that outgrew it), the writer stores them in the new shard before it
// raises the count in shard 0, then removes them from the old one; a reader that waits for
// every shard of the count it read never misses an entry.

// GroupShards is the shard index in a group's first ConfigMap. Version 1 knows counts that are
// powers of two only; version 2 any count.
type GroupShards struct {
	Version int `json:"version"`
	// Count of ConfigMaps holding the documents, shard 0 included.
	Count int `json:"count"`
}

// MaxShards bounds GroupShards.Count.
const MaxShards = 64

// Validate checks the count.
func (s *GroupShards) Validate() error {
	if s.Count < 1 || s.Count > MaxShards {
		return fmt.Errorf("shard count %d must be from 1 to %d", s.Count, MaxShards)
	}
	return nil
}

func (s *GroupShards) powerOfTwo() bool { return s.Count&(s.Count-1) == 0 }

// GroupShardIndexes stores GroupShards documents: a count that is a power of two in v1 and
// v2, which say the same of it, any other in v2 alone.
var GroupShardIndexes = codec[GroupShards]{
	name: "group-shards",
	encode: map[int]func(*GroupShards) ([]byte, error){
		1: onlyIf((*GroupShards).powerOfTwo, jsonEncoder(1, func(s *GroupShards, v int) { s.Version = v })),
		2: jsonEncoder(2, func(s *GroupShards, v int) { s.Version = v }),
	},
	decode: map[int]func([]byte) (*GroupShards, error){
		1: jsonDecoder(1, func(s *GroupShards) int { return s.Version }, func(s *GroupShards) error {
			if !s.powerOfTwo() {
				return fmt.Errorf("shard count %d must be a power of two in version 1", s.Count)
			}
			return s.Validate()
		}),
		2: jsonDecoder(2, func(s *GroupShards) int { return s.Version }, (*GroupShards).Validate),
	},
}

// ShardCount reads the shard count from a group's first ConfigMap: 1 when it has no index.
func ShardCount(main map[string][]byte) (int, error) {
	return indexCount(GroupShardIndexes, main, func(s *GroupShards) int { return s.Count })
}

// ConfigMapBytes is a ConfigMap's data as the readers of documents take it.
func ConfigMapBytes(data map[string]string) map[string][]byte {
	out := make(map[string][]byte, len(data))
	for k, v := range data {
		out[k] = []byte(v)
	}
	return out
}

// ShardCountOf is ShardCount of a ConfigMap's data as strings, without copying its documents.
func ShardCountOf(main map[string]string) (int, error) {
	re := GroupShardIndexes.keyPattern()
	idx := map[string][]byte{}
	for k, v := range main {
		if re.MatchString(k) {
			idx[k] = []byte(v)
		}
	}
	return ShardCount(idx)
}

// indexCount reads the count of a shard index in data: 1 without one. An empty value is no
// index, as a writer's way of removing it.
func indexCount[T any](c codec[T], data map[string][]byte, count func(*T) int) (int, error) {
	idx := map[string][]byte{}
	for _, v := range c.found(data) {
		if b := data[c.key(v)]; len(b) > 0 {
			idx[c.key(v)] = b
		}
	}
	if len(idx) == 0 {
		return 1, nil
	}
	doc, _, err := c.Decode(idx)
	if err != nil {
		return 0, err
	}
	return count(doc), nil
}

// ShardName is the name of shard i of the group whose first ConfigMap is main.
func ShardName(main string, i int) string {
	if i == 0 {
		return main
	}
	return fmt.Sprintf("%s-%d", main, i)
}

// ShardOf is the shard, of count, that holds a service's entries: its hash modulo the power of
// two at or above count, or, when that shard does not exist yet, modulo the power below.
// Growing the count by one then splits one shard only (linear hashing); for a count that is a
// power of two it is the hash modulo the count, as version 1 of the index says.
func ShardOf(service string, count int) int {
	if count <= 1 {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(service))
	sum := h.Sum32()
	size := uint32(1) << bits.Len(uint(count-1))
	if s := sum % size; s < uint32(count) {
		return int(s)
	}
	return int(sum % (size / 2))
}

// SplitShard is the shard whose entries growing from count shards to count+1 moves to the new
// one, shard count; the others keep theirs.
func SplitShard(count int) int {
	return count - 1<<(bits.Len(uint(count))-1)
}

// GroupDocuments is what a group's shards say together. A document that some shard holds in
// no version this build reads is nil, with its error.
type GroupDocuments struct {
	Serve    *ServeConfig
	ServeErr error
	DNAT     *DNATConfig
	DNATErr  error
}

// MergeShards decodes and joins the documents of every shard. A document absent from a shard is
// empty there; one this build cannot read in any shard fails that document as a whole: a
// replica then keeps the last one it could read. An entry found in two shards (while it
// moves) counts as in its hash shard (ShardOf) when one of them is, else in the first.
func MergeShards(shards []map[string][]byte) GroupDocuments {
	out := GroupDocuments{Serve: &ServeConfig{Services: map[string]WebService{}}, DNAT: &DNATConfig{Services: map[string]DNATService{}}}
	var serveErrs, dnatErrs []error
	for i, data := range shards {
		if serve, err := decodeIfPresent(ServeConfigs, data); err != nil {
			serveErrs = append(serveErrs, shardErr(i, len(shards), err))
		} else if serve != nil {
			out.Serve.Version = max(out.Serve.Version, serve.Version)
			addShard(out.Serve.Services, serve.Services, i, len(shards))
		}
		if dnat, err := decodeIfPresent(DNATConfigs, data); err != nil {
			dnatErrs = append(dnatErrs, shardErr(i, len(shards), err))
		} else if dnat != nil {
			out.DNAT.Version = max(out.DNAT.Version, dnat.Version)
			addShard(out.DNAT.Services, dnat.Services, i, len(shards))
		}
	}
	if out.ServeErr = errors.Join(serveErrs...); out.ServeErr != nil {
		out.Serve = nil
	}
	if out.DNATErr = errors.Join(dnatErrs...); out.DNATErr != nil {
		out.DNAT = nil
	}
	return out
}

func shardErr(i, count int, err error) error {
	if count == 1 {
		return err
	}
	return fmt.Errorf("shard %d of %d: %w", i, count, err)
}

// addShard adds a shard's entries: those of their own shard over any other.
func addShard[V any](into, from map[string]V, shard, count int) {
	for name, v := range from {
		if _, dup := into[name]; !dup || ShardOf(name, count) == shard {
			into[name] = v
		}
	}
}

// decodeIfPresent decodes a document that data holds in some version; nil when it holds none.
func decodeIfPresent[T any](c codec[T], data map[string][]byte) (*T, error) {
	if !c.Present(data) {
		return nil, nil
	}
	doc, _, err := c.Decode(data)
	return doc, err
}
