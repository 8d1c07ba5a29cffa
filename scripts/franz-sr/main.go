// Command franz-sr checks spate's built-in schema registry with franz-go's registry client
// (pkg/sr) and its Serde, and spate's Kafka listener with franz-go's kgo: registration and
// lookup, the Confluent wire format written and read back, compatibility verdicts, ids by
// subject and version, per-subject configs and soft deletes. Exits non-zero on the first
// check that fails. Run by scripts/schema-registry-franz-e2e.sh (env SPATE_BOOTSTRAP and
// SPATE_REGISTRY).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
)

const (
	subject = "franz-orders-value"
	topic   = "franz-orders"
	records = 200
)

// The same Order as the schemas below: v1 has id and qty, v2 adds channel with a default.
type orderV1 struct {
	ID  string `avro:"id"`
	Qty int    `avro:"qty"`
}

type orderV2 struct {
	ID      string `avro:"id"`
	Qty     int    `avro:"qty"`
	Channel string `avro:"channel"`
}

const (
	v1Text = `{"type":"record","name":"Order","fields":[{"name":"id","type":"string"},{"name":"qty","type":"int"}]}`
	v2Text = `{"type":"record","name":"Order","fields":[{"name":"id","type":"string"},{"name":"qty","type":"int"},{"name":"channel","type":"string","default":"web"}]}`
	// qty changes type: no reader of v2 can read it.
	breaking = `{"type":"record","name":"Order","fields":[{"name":"id","type":"string"},{"name":"qty","type":"string"},{"name":"channel","type":"string","default":"web"}]}`
)

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "FAIL: "+format+"\n", args...)
	os.Exit(1)
}

func ok(format string, args ...any) {
	fmt.Printf("ok    "+format+"\n", args...)
}

func must[T any](v T, err error) func(what string) T {
	return func(what string) T {
		if err != nil {
			fail("%s: %v", what, err)
		}
		return v
	}
}

// registerSerde registers `id` for values of type T with an Avro schema in `serde`.
func registerSerde[T any](serde *sr.Serde, id int, text string) {
	schema := must(avro.Parse(text))("parsing " + text)
	var zero T
	serde.Register(id, zero,
		sr.EncodeFn(func(v any) ([]byte, error) { return avro.Marshal(schema, v) }),
		sr.DecodeFn(func(b []byte, v any) error { return avro.Unmarshal(schema, b, v) }))
}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	reg := must(sr.NewClient(sr.URLs(os.Getenv("SPATE_REGISTRY"))))("registry client")

	types := must(reg.SupportedTypes(ctx))("/schemas/types")
	if !slices.Contains(types, sr.TypeAvro) || !slices.Contains(types, sr.TypeProtobuf) {
		fail("supported types %v", types)
	}
	v1 := must(reg.CreateSchema(ctx, subject, sr.Schema{Schema: v1Text}))("registering v1")
	again := must(reg.CreateSchema(ctx, subject, sr.Schema{Schema: v1Text}))("registering v1 again")
	found := must(reg.LookupSchema(ctx, subject, sr.Schema{Schema: v1Text}))("looking v1 up")
	if v1.Version != 1 || again.ID != v1.ID || found.ID != v1.ID || found.Version != 1 {
		fail("v1 %+v, again %+v, lookup %+v", v1, again, found)
	}
	ok("v1 registered as id %d version 1; the same schema again and a lookup give the same", v1.ID)

	cl := must(kgo.NewClient(kgo.SeedBrokers(os.Getenv("SPATE_BOOTSTRAP")),
		kgo.AllowAutoTopicCreation(), kgo.RequiredAcks(kgo.AllISRAcks())))("kafka client")
	defer cl.Close()
	var serde sr.Serde
	registerSerde[orderV1](&serde, v1.ID, v1Text)
	var sent []orderV1
	for i := range records {
		o := orderV1{ID: fmt.Sprintf("o-%d", i), Qty: i % 13}
		value := must(serde.Encode(o))("encoding")
		if value[0] != 0 || int(value[1])<<24|int(value[2])<<16|int(value[3])<<8|int(value[4]) != v1.ID {
			fail("not the wire format of id %d: % x", v1.ID, value[:5])
		}
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: value}).FirstErr(); err != nil {
			fail("producing: %v", err)
		}
		sent = append(sent, o)
	}

	// A fresh Serde that knows ids only from the registry, as a consumer elsewhere would.
	reader := must(kgo.NewClient(kgo.SeedBrokers(os.Getenv("SPATE_BOOTSTRAP")),
		kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())))("kafka reader")
	defer reader.Close()
	var got []orderV1
	var readSerde sr.Serde
	for len(got) < records {
		fetches := reader.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			fail("read %d of %d records: %v", len(got), records, err)
		}
		fetches.EachError(func(t string, p int32, err error) { fail("fetching %s/%d: %v", t, p, err) })
		fetches.EachRecord(func(r *kgo.Record) {
			id, _, err := readSerde.DecodeID(r.Value)
			if err != nil {
				fail("reading the id: %v", err)
			}
			if id != v1.ID {
				fail("record with id %d, want %d", id, v1.ID)
			}
			text := must(reg.SchemaTextByID(ctx, id))("schema text by id")
			registerSerde[orderV1](&readSerde, id, text)
			var o orderV1
			if err := readSerde.Decode(r.Value, &o); err != nil {
				fail("decoding: %v", err)
			}
			got = append(got, o)
		})
	}
	if !slices.Equal(got, sent) {
		fail("read back %v..., sent %v...", got[:3], sent[:3])
	}
	ok("%d records written with franz-go's Serde read back through the registry's schema", records)

	check := must(reg.CheckCompatibility(ctx, subject, -1, sr.Schema{Schema: v2Text}))("checking v2")
	if !check.Is {
		fail("v2 (a field with a default added) found incompatible: %v", check.Messages)
	}
	v2 := must(reg.CreateSchema(ctx, subject, sr.Schema{Schema: v2Text}))("registering v2")
	if v2.Version != 2 || v2.ID == v1.ID {
		fail("v2 %+v", v2)
	}
	check = must(reg.CheckCompatibility(ctx, subject, -1, sr.Schema{Schema: breaking}))("checking a breaking change")
	if check.Is {
		fail("qty int -> string found compatible")
	}
	_, err := reg.CreateSchema(ctx, subject, sr.Schema{Schema: breaking})
	var srErr *sr.ResponseError
	if !errors.As(err, &srErr) || srErr.ErrorCode != 409 {
		fail("registering a breaking change: %v, want error code 409", err)
	}
	ok("v2 compatible and registered (id %d); qty int -> string incompatible, 409", v2.ID)

	versions := must(reg.SubjectVersions(ctx, subject))("versions")
	byVersion := must(reg.SchemaByVersion(ctx, subject, 2))("version 2")
	subjects := must(reg.SubjectsByID(ctx, v1.ID))("subjects of id v1")
	uses := must(reg.SchemaVersionsByID(ctx, v2.ID))("versions of id v2")
	if !slices.Equal(versions, []int{1, 2}) || byVersion.ID != v2.ID || !slices.Equal(subjects, []string{subject}) ||
		len(uses) != 1 || uses[0].Subject != subject || uses[0].Version != 2 {
		fail("versions %v, version 2 %+v, subjects of %d %v, uses of %d %+v", versions, byVersion, v1.ID, subjects, v2.ID, uses)
	}
	ok("versions, schema by version, subjects and versions by id agree")

	for _, r := range reg.SetCompatibility(ctx, sr.SetCompatibility{Level: sr.CompatFull}, subject) {
		if r.Err != nil || r.Level != sr.CompatFull {
			fail("setting FULL: %+v", r)
		}
	}
	for _, r := range reg.Compatibility(ctx, subject) {
		if r.Err != nil || r.Level != sr.CompatFull {
			fail("reading the subject's level: %+v", r)
		}
	}
	ok("the subject's level set to FULL and read back")

	deleted := must(reg.DeleteSubject(ctx, subject, sr.SoftDelete))("soft delete")
	left := must(reg.Subjects(ctx))("subjects")
	if !slices.Equal(deleted, []int{1, 2}) || slices.Contains(left, subject) {
		fail("soft delete answered %v; subjects after: %v", deleted, left)
	}
	// A deleted subject's ids still resolve: records written with them stay readable.
	if _, err := reg.SchemaByID(ctx, v1.ID); err != nil {
		fail("id %d after the soft delete: %v", v1.ID, err)
	}
	ok("soft delete: versions 1 and 2 gone from the subject list, their ids still resolve")
	fmt.Println("franz-go schema registry e2e: all checks passed")
}
