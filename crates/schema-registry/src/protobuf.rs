//! Protobuf schemas: `.proto` text (proto2 and proto3) or a base64 `FileDescriptorProto` (what
//! Confluent's serializers send), compiled with `protox` with imports resolved through the
//! schema's references and Google's well-known types (`google/protobuf/*.proto`) built in;
//! printed back as one canonical `.proto` text; checked for wire compatibility; and used to
//! encode JSON records.
//!
//! The canonical text is what is stored and served: every type name fully qualified, options
//! spelled out, comments and layout dropped. So the same schema sent as text (any layout) or
//! as a descriptor gets one text, and with it one id.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;

use base64::Engine as _;
use prost::Message as _;
use prost_reflect::{
    Cardinality, DescriptorPool, DynamicMessage, EnumDescriptor, ExtensionDescriptor,
    FieldDescriptor, FileDescriptor, Kind, MessageDescriptor, Syntax, Value,
};
use protox::file::{File, FileResolver, GoogleFileResolver};

use crate::schema::{Resolved, SchemaType};

/// The name the schema's own file gets among its imports (Confluent's deserializers name it
/// so too).
pub const MAIN_FILE: &str = "default";

/// Files the registry knows without a reference: Google's well-known types.
pub fn is_builtin(name: &str) -> bool {
    GoogleFileResolver::new().open_file(name).is_ok()
}

/// A compiled Protobuf schema.
#[derive(Debug, Clone)]
pub struct ProtoSchema {
    file: FileDescriptor,
}

impl ProtoSchema {
    /// The compiled file.
    pub fn file(&self) -> &FileDescriptor {
        &self.file
    }

    /// The canonical `.proto` text.
    pub fn canonical(&self) -> String {
        print(&self.file)
    }

    /// The schema as Confluent's `format=serialized` answers it: its `FileDescriptorProto`
    /// (without source info), base64.
    pub fn serialized(&self) -> String {
        // Through a dynamic message: prost's own types would drop custom options.
        let bytes = match rename_descriptor(&self.file.encode_to_vec(), None) {
            Some(b) => b,
            None => {
                let mut proto = self.file.file_descriptor_proto().clone();
                proto.source_code_info = None;
                proto.encode_to_vec()
            }
        };
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    /// The message records are written with when none is named: the file's first, index
    /// list `[0]`, as Confluent's REST Proxy picks it.
    pub fn first_message(&self) -> Option<MessageDescriptor> {
        self.file.messages().next()
    }

    /// Encodes one JSON value (Protobuf's JSON mapping) as `message`.
    pub fn encode_json(message: &MessageDescriptor, json: &str) -> Result<Vec<u8>, String> {
        let mut de = serde_json::Deserializer::from_str(json);
        let msg =
            DynamicMessage::deserialize(message.clone(), &mut de).map_err(|e| e.to_string())?;
        de.end().map_err(|e| e.to_string())?;
        Ok(msg.encode_to_vec())
    }
}

/// The bytes of a base64 `FileDescriptorProto`, when `text` is one.
fn descriptor_bytes(text: &str) -> Option<Vec<u8>> {
    let t = text.trim();
    if t.is_empty()
        || !t
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='))
    {
        return None;
    }
    let bytes = base64::engine::general_purpose::STANDARD.decode(t).ok()?;
    prost_types::FileDescriptorProto::decode(bytes.as_slice())
        .ok()
        .map(|_| bytes)
}

/// An encoded `FileDescriptorProto` without source info and, with `name`, renamed; unknown
/// fields (custom options) kept.
fn rename_descriptor(bytes: &[u8], name: Option<&str>) -> Option<Vec<u8>> {
    let desc =
        DescriptorPool::global().get_message_by_name("google.protobuf.FileDescriptorProto")?;
    let mut msg = DynamicMessage::decode(desc, bytes).ok()?;
    msg.clear_field_by_name("source_code_info");
    if let Some(name) = name {
        msg.set_field_by_name("name", Value::String(name.to_string()));
    }
    Some(msg.encode_to_vec())
}

/// Serves the schema's own file and its references by name, Google's files otherwise.
struct Files {
    files: HashMap<String, String>,
    google: GoogleFileResolver,
}

impl FileResolver for Files {
    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        let Some(text) = self.files.get(name) else {
            return self.google.open_file(name);
        };
        match descriptor_bytes(text) {
            Some(bytes) => {
                // Imports find the file by the name it is referenced by, whatever it was
                // called where it was compiled.
                let renamed = rename_descriptor(&bytes, Some(name)).ok_or_else(|| {
                    protox::Error::new(std::io::Error::other("not a FileDescriptorProto"))
                })?;
                File::decode_file_descriptor_proto(renamed.as_slice()).map_err(protox::Error::new)
            }
            None => File::from_source(name, text),
        }
    }
}

/// Compiles `text` (`.proto` source or a base64 descriptor) with its references.
pub fn parse(text: &str, references: &[Resolved]) -> Result<ProtoSchema, String> {
    let mut files = HashMap::new();
    for r in references {
        if r.schema_type != SchemaType::Protobuf {
            return Err(format!(
                "reference '{}' is a {} schema; a PROTOBUF schema imports PROTOBUF schemas only",
                r.name,
                r.schema_type.name()
            ));
        }
        files.insert(r.name.clone(), r.text.clone());
    }
    files.insert(MAIN_FILE.to_string(), text.to_string());
    let mut compiler = protox::Compiler::with_file_resolver(Files {
        files,
        google: GoogleFileResolver::new(),
    });
    compiler
        .open_file(MAIN_FILE)
        .map_err(|e| format!("invalid .proto: {}", one_line(&e.to_string())))?;
    let pool: DescriptorPool = compiler.descriptor_pool();
    let file = pool
        .get_file_by_name(MAIN_FILE)
        .ok_or_else(|| "invalid .proto: the file did not compile".to_string())?;
    Ok(ProtoSchema { file })
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

// ---------------------------------------------------------------------------------------------
// Canonical text.

/// The canonical `.proto` text of `file`.
pub fn print(file: &FileDescriptor) -> String {
    let mut p = Printer::default();
    let proto = file.file_descriptor_proto();
    p.line(match file.syntax() {
        Syntax::Proto2 => "syntax = \"proto2\";",
        Syntax::Proto3 => "syntax = \"proto3\";",
    });
    if !file.package_name().is_empty() {
        p.line(&format!("package {};", file.package_name()));
    }
    if !proto.dependency.is_empty() {
        p.blank();
        for (i, dep) in proto.dependency.iter().enumerate() {
            let i = i as i32;
            let kind = if proto.public_dependency.contains(&i) {
                "public "
            } else if proto.weak_dependency.contains(&i) {
                "weak "
            } else {
                ""
            };
            p.line(&format!("import {kind}{};", quote(dep.as_bytes())));
        }
    }
    let options = option_statements(&file.options());
    if !options.is_empty() {
        p.blank();
        for o in options {
            p.line(&o);
        }
    }
    for m in file.messages() {
        p.blank();
        p.message(&m);
    }
    for e in file.enums() {
        p.blank();
        p.enumeration(&e);
    }
    for s in file.services() {
        p.blank();
        p.line(&format!("service {} {{", s.name()));
        p.depth += 1;
        for o in option_statements(&s.options()) {
            p.line(&o);
        }
        for m in s.methods() {
            let stream = |yes: bool| if yes { "stream " } else { "" };
            let head = format!(
                "rpc {}({}.{}) returns ({}.{})",
                m.name(),
                stream(m.is_client_streaming()),
                m.input().full_name(),
                stream(m.is_server_streaming()),
                m.output().full_name()
            );
            let opts = option_statements(&m.options());
            if opts.is_empty() {
                p.line(&format!("{head};"));
            } else {
                p.line(&format!("{head} {{"));
                p.depth += 1;
                for o in opts {
                    p.line(&o);
                }
                p.depth -= 1;
                p.line("}");
            }
        }
        p.depth -= 1;
        p.line("}");
    }
    let extensions: Vec<ExtensionDescriptor> = file.extensions().collect();
    if !extensions.is_empty() {
        p.blank();
        p.extends(&extensions, file.syntax());
    }
    p.out
}

#[derive(Default)]
struct Printer {
    out: String,
    depth: usize,
}

impl Printer {
    fn line(&mut self, s: &str) {
        for _ in 0..self.depth {
            self.out.push_str("  ");
        }
        self.out.push_str(s);
        self.out.push('\n');
    }

    fn blank(&mut self) {
        if !self.out.is_empty() && !self.out.ends_with("{\n") {
            self.out.push('\n');
        }
    }

    fn message(&mut self, m: &MessageDescriptor) {
        self.line(&format!("message {} {{", m.name()));
        self.depth += 1;
        self.message_body(m);
        self.depth -= 1;
        self.line("}");
    }

    fn message_body(&mut self, m: &MessageDescriptor) {
        let syntax = m.parent_file().syntax();
        for o in option_statements(&m.options()) {
            self.line(&o);
        }
        let mut printed_oneofs = HashSet::new();
        // Groups print their message where the field is.
        let mut group_types = HashSet::new();
        for f in m.fields() {
            if let Some(o) = f.containing_oneof().filter(|o| !o.is_synthetic()) {
                if printed_oneofs.insert(o.name().to_string()) {
                    self.line(&format!("oneof {} {{", o.name()));
                    self.depth += 1;
                    for o in option_statements(&o.options()) {
                        self.line(&o);
                    }
                    for of in o.fields() {
                        if of.is_group() {
                            if let Kind::Message(g) = of.kind() {
                                group_types.insert(g.full_name().to_string());
                            }
                        }
                        self.field(&of, syntax, true);
                    }
                    self.depth -= 1;
                    self.line("}");
                }
                continue;
            }
            if f.is_group() {
                if let Kind::Message(g) = f.kind() {
                    group_types.insert(g.full_name().to_string());
                }
            }
            self.field(&f, syntax, false);
        }
        for child in m.child_messages() {
            if child.is_map_entry() || group_types.contains(child.full_name()) {
                continue;
            }
            self.message(&child);
        }
        for e in m.child_enums() {
            self.enumeration(&e);
        }
        let extensions: Vec<ExtensionDescriptor> = m.child_extensions().collect();
        if !extensions.is_empty() {
            self.extends(&extensions, syntax);
        }
        let ranges: Vec<String> = m
            .extension_ranges()
            .map(|r| range(r.start, r.end.saturating_sub(1), FIELD_MAX))
            .collect();
        if !ranges.is_empty() {
            self.line(&format!("extensions {};", ranges.join(", ")));
        }
        let reserved: Vec<String> = m
            .reserved_ranges()
            .map(|r| range(r.start, r.end.saturating_sub(1), FIELD_MAX))
            .collect();
        if !reserved.is_empty() {
            self.line(&format!("reserved {};", reserved.join(", ")));
        }
        let names: Vec<String> = m.reserved_names().map(|n| quote(n.as_bytes())).collect();
        if !names.is_empty() {
            self.line(&format!("reserved {};", names.join(", ")));
        }
    }

    fn field(&mut self, f: &FieldDescriptor, syntax: Syntax, in_oneof: bool) {
        let proto = f.field_descriptor_proto();
        let label = if in_oneof || f.is_map() {
            ""
        } else {
            match f.cardinality() {
                Cardinality::Repeated => "repeated ",
                Cardinality::Required => "required ",
                Cardinality::Optional => match syntax {
                    Syntax::Proto2 => "optional ",
                    Syntax::Proto3 if proto.proto3_optional() => "optional ",
                    Syntax::Proto3 => "",
                },
            }
        };
        let mut extras = Vec::new();
        if let Some(d) = &proto.default_value {
            extras.push(format!("default = {}", default_literal(f, d)));
        }
        if proto
            .json_name
            .as_deref()
            .is_some_and(|j| j != json_name_of(f.name()))
        {
            extras.push(format!("json_name = {}", quote(f.json_name().as_bytes())));
        }
        extras.extend(option_pairs(&f.options()));
        let extras = if extras.is_empty() {
            String::new()
        } else {
            format!(" [{}]", extras.join(", "))
        };
        if f.is_group() {
            if let Kind::Message(g) = f.kind() {
                self.line(&format!(
                    "{label}group {} = {}{extras} {{",
                    g.name(),
                    f.number()
                ));
                self.depth += 1;
                self.message_body(&g);
                self.depth -= 1;
                self.line("}");
                return;
            }
        }
        let ty = match f.kind() {
            Kind::Message(entry) if f.is_map() => format!(
                "map<{}, {}>",
                type_name(&entry.map_entry_key_field().kind()),
                type_name(&entry.map_entry_value_field().kind())
            ),
            k => type_name(&k),
        };
        self.line(&format!(
            "{label}{ty} {} = {}{extras};",
            f.name(),
            f.number()
        ));
    }

    fn extends(&mut self, extensions: &[ExtensionDescriptor], syntax: Syntax) {
        // One block per extended message, in the order they first appear.
        let mut order: Vec<String> = Vec::new();
        let mut by: HashMap<String, Vec<&ExtensionDescriptor>> = HashMap::new();
        for x in extensions {
            let target = x.containing_message().full_name().to_string();
            if !by.contains_key(&target) {
                order.push(target.clone());
            }
            by.entry(target).or_default().push(x);
        }
        for target in order {
            self.line(&format!("extend .{target} {{"));
            self.depth += 1;
            for x in by.get(&target).map(Vec::as_slice).unwrap_or_default() {
                let label = match (x.cardinality(), syntax) {
                    (Cardinality::Repeated, _) => "repeated ",
                    (Cardinality::Required, _) => "required ",
                    (Cardinality::Optional, Syntax::Proto2) => "optional ",
                    (Cardinality::Optional, Syntax::Proto3) => "",
                };
                let mut extras = option_pairs(&x.options());
                if let Some(d) = &x.field_descriptor_proto().default_value {
                    extras.insert(0, format!("default = {d}"));
                }
                let extras = if extras.is_empty() {
                    String::new()
                } else {
                    format!(" [{}]", extras.join(", "))
                };
                self.line(&format!(
                    "{label}{} {} = {}{extras};",
                    type_name(&x.kind()),
                    x.name(),
                    x.number()
                ));
            }
            self.depth -= 1;
            self.line("}");
        }
    }

    fn enumeration(&mut self, e: &EnumDescriptor) {
        self.line(&format!("enum {} {{", e.name()));
        self.depth += 1;
        for o in option_statements(&e.options()) {
            self.line(&o);
        }
        // Declaration order (aliases share a number, and the descriptor sorts by number).
        let values = e
            .enum_descriptor_proto()
            .value
            .iter()
            .filter_map(|v| e.get_value_by_name(v.name()));
        for v in values {
            let opts = option_pairs(&v.options());
            let opts = if opts.is_empty() {
                String::new()
            } else {
                format!(" [{}]", opts.join(", "))
            };
            self.line(&format!("{} = {}{opts};", v.name(), v.number()));
        }
        let reserved: Vec<String> = e
            .reserved_ranges()
            .map(|r| {
                if *r.end() == i32::MAX && *r.start() != i32::MAX {
                    format!("{} to max", r.start())
                } else if r.start() == r.end() {
                    r.start().to_string()
                } else {
                    format!("{} to {}", r.start(), r.end())
                }
            })
            .collect();
        if !reserved.is_empty() {
            self.line(&format!("reserved {};", reserved.join(", ")));
        }
        let names: Vec<String> = e.reserved_names().map(|n| quote(n.as_bytes())).collect();
        if !names.is_empty() {
            self.line(&format!("reserved {};", names.join(", ")));
        }
        self.depth -= 1;
        self.line("}");
    }
}

/// Highest field number.
const FIELD_MAX: u32 = 536_870_911;

fn range(start: u32, last: u32, max: u32) -> String {
    if last >= max && start < max {
        format!("{start} to max")
    } else if start == last {
        start.to_string()
    } else {
        format!("{start} to {last}")
    }
}

/// The JSON name protoc gives a field by default: underscores dropped, the letter after each
/// one upper-cased.
fn json_name_of(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for c in name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

fn type_name(k: &Kind) -> String {
    match k {
        Kind::Double => "double".into(),
        Kind::Float => "float".into(),
        Kind::Int32 => "int32".into(),
        Kind::Int64 => "int64".into(),
        Kind::Uint32 => "uint32".into(),
        Kind::Uint64 => "uint64".into(),
        Kind::Sint32 => "sint32".into(),
        Kind::Sint64 => "sint64".into(),
        Kind::Fixed32 => "fixed32".into(),
        Kind::Fixed64 => "fixed64".into(),
        Kind::Sfixed32 => "sfixed32".into(),
        Kind::Sfixed64 => "sfixed64".into(),
        Kind::Bool => "bool".into(),
        Kind::String => "string".into(),
        Kind::Bytes => "bytes".into(),
        Kind::Message(m) => format!(".{}", m.full_name()),
        Kind::Enum(e) => format!(".{}", e.full_name()),
    }
}

/// A field's proto2 default as `.proto` spells it (the descriptor holds strings raw and
/// bytes C-escaped already).
fn default_literal(f: &FieldDescriptor, d: &str) -> String {
    match f.kind() {
        Kind::String => quote(d.as_bytes()),
        Kind::Bytes => format!("\"{d}\""),
        _ => d.to_string(),
    }
}

/// A string literal: printable ASCII as is, the rest escaped in octal.
fn quote(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() + 2);
    out.push('"');
    for &b in bytes {
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            0x20..=0x7e => out.push(b as char),
            _ => {
                let _ = write!(out, "\\{b:03o}");
            }
        }
    }
    out.push('"');
    out
}

/// `option name = value;` lines for the options set in `options`.
fn option_statements(options: &DynamicMessage) -> Vec<String> {
    option_pairs(options)
        .into_iter()
        .map(|p| format!("option {p};"))
        .collect()
}

/// `name = value` for each option set (extensions as `(full.name)`), in field-number order.
fn option_pairs(options: &DynamicMessage) -> Vec<String> {
    let mut out = Vec::new();
    for (f, v) in options.fields() {
        if f.name() == "uninterpreted_option" {
            continue;
        }
        push_option(&mut out, f.name().to_string(), &f.kind(), v);
    }
    for (x, v) in options.extensions() {
        push_option(&mut out, format!("({})", x.full_name()), &x.kind(), v);
    }
    out
}

fn push_option(out: &mut Vec<String>, name: String, kind: &Kind, v: &Value) {
    match v {
        Value::List(items) => {
            for item in items {
                out.push(format!("{name} = {}", option_value(kind, item)));
            }
        }
        Value::Map(_) => {}
        v => out.push(format!("{name} = {}", option_value(kind, v))),
    }
}

fn option_value(kind: &Kind, v: &Value) -> String {
    match v {
        Value::Bool(b) => b.to_string(),
        Value::I32(n) => n.to_string(),
        Value::I64(n) => n.to_string(),
        Value::U32(n) => n.to_string(),
        Value::U64(n) => n.to_string(),
        Value::F32(n) => float(f64::from(*n)),
        Value::F64(n) => float(*n),
        Value::String(s) => quote(s.as_bytes()),
        Value::Bytes(b) => quote(b),
        Value::EnumNumber(n) => match kind {
            Kind::Enum(e) => e
                .get_value(*n)
                .map(|v| v.name().to_string())
                .unwrap_or_else(|| n.to_string()),
            _ => n.to_string(),
        },
        Value::Message(m) => format!("{{ {} }}", m.to_text_format()),
        Value::List(_) | Value::Map(_) => String::new(),
    }
}

fn float(n: f64) -> String {
    if n.is_nan() {
        "nan".into()
    } else if n.is_infinite() {
        if n > 0.0 { "inf" } else { "-inf" }.into()
    } else {
        format!("{n:?}")
    }
}

// ---------------------------------------------------------------------------------------------
// Compatibility.

/// One difference between two versions of a schema, as Confluent's registry names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// A message of the old schema is gone (and not moved elsewhere in the file).
    MessageRemoved,
    /// A field changed between scalar, message, enum and map.
    FieldKindChanged,
    /// A scalar field changed to a scalar with another wire encoding.
    FieldScalarKindChanged,
    /// A message or enum field now names another type.
    FieldNamedTypeChanged,
    /// A numeric field changed between single and repeated (packed encodings differ).
    FieldNumericLabelChanged,
    /// A required field was added (or a field became required).
    RequiredFieldAdded,
    /// A required field was removed (or a field is no longer required).
    RequiredFieldRemoved,
    /// A field left its oneof.
    OneofFieldRemoved,
    /// A new oneof holds more than one field that existed before.
    MultipleFieldsMovedToOneof,
    /// A field that existed outside a oneof moved into an existing oneof.
    FieldMovedToExistingOneof,
}

impl Change {
    fn name(self) -> &'static str {
        match self {
            Change::MessageRemoved => "MESSAGE_REMOVED",
            Change::FieldKindChanged => "FIELD_KIND_CHANGED",
            Change::FieldScalarKindChanged => "FIELD_SCALAR_KIND_CHANGED",
            Change::FieldNamedTypeChanged => "FIELD_NAMED_TYPE_CHANGED",
            Change::FieldNumericLabelChanged => "FIELD_NUMERIC_LABEL_CHANGED",
            Change::RequiredFieldAdded => "REQUIRED_FIELD_ADDED",
            Change::RequiredFieldRemoved => "REQUIRED_FIELD_REMOVED",
            Change::OneofFieldRemoved => "ONEOF_FIELD_REMOVED",
            Change::MultipleFieldsMovedToOneof => "MULTIPLE_FIELDS_MOVED_TO_ONEOF",
            Change::FieldMovedToExistingOneof => "FIELD_MOVED_TO_EXISTING_ONEOF",
        }
    }
}

/// What keeps data written with `writer` from being read with `reader`: the incompatible
/// differences from `writer` (the original) to `reader` (the update). Compatible changes
/// (messages, enums, fields and oneofs added; fields, enums and oneofs removed; names, the
/// package and the syntax changed; enum constants changed; string/bytes/message fields made
/// repeated or single) are not listed.
pub fn incompatibilities(reader: &ProtoSchema, writer: &ProtoSchema) -> Vec<String> {
    diff(&writer.file, &reader.file)
        .into_iter()
        .map(|(c, path, detail)| format!("{} at {path}: {detail}", c.name()))
        .collect()
}

/// The incompatible changes from `original` to `update`, with where and what.
pub fn diff(original: &FileDescriptor, update: &FileDescriptor) -> Vec<(Change, String, String)> {
    let mut d = Diff {
        out: Vec::new(),
        visited: HashSet::new(),
    };
    let old = messages_by_name(original);
    let new = messages_by_name(update);
    let new_simple: HashSet<&str> = new.values().map(|m| m.name()).collect();
    for (name, om) in &old {
        match new.get(name) {
            Some(um) => d.message(name, om, um),
            // Moved (to another scope of the file): compatible, as in Confluent's registry.
            None if new_simple.contains(om.name()) => {}
            None => d.push(
                Change::MessageRemoved,
                name,
                "the message is not in the new schema".into(),
            ),
        }
    }
    d.out
}

/// Every message of the file (nested ones too, map entries not) by its name relative to the
/// file's package, so a changed package compares the same messages.
fn messages_by_name(file: &FileDescriptor) -> BTreeMap<String, MessageDescriptor> {
    fn walk(m: MessageDescriptor, out: &mut BTreeMap<String, MessageDescriptor>) {
        if m.is_map_entry() {
            return;
        }
        for c in m.child_messages() {
            walk(c, out);
        }
        out.insert(relative_name(m.full_name(), m.package_name()), m);
    }
    let mut out = BTreeMap::new();
    for m in file.messages() {
        walk(m, &mut out);
    }
    out
}

fn relative_name(full: &str, package: &str) -> String {
    if package.is_empty() {
        return full.to_string();
    }
    full.strip_prefix(package)
        .and_then(|r| r.strip_prefix('.'))
        .unwrap_or(full)
        .to_string()
}

/// A named type as compared: relative to the package inside the schema's own file, in full
/// for a referenced or built-in file's types.
fn named(full: &str, file: &FileDescriptor, package: &str) -> String {
    if file.name() == MAIN_FILE {
        relative_name(full, package)
    } else {
        format!(".{full}")
    }
}

struct Diff {
    out: Vec<(Change, String, String)>,
    /// Referenced messages compared already (a recursive type is compared once).
    visited: HashSet<(String, String)>,
}

#[derive(PartialEq, Eq, Clone, Copy, Debug)]
enum Label {
    Single,
    Repeated,
    Required,
}

fn label(f: &FieldDescriptor) -> Label {
    match f.cardinality() {
        Cardinality::Repeated => Label::Repeated,
        Cardinality::Required => Label::Required,
        Cardinality::Optional => Label::Single,
    }
}

/// Scalars that read each other's encoding: varints, zigzag varints, 32-bit, 64-bit and
/// length-delimited ones.
fn wire_group(k: &Kind) -> Option<u8> {
    Some(match k {
        Kind::Int32 | Kind::Uint32 | Kind::Int64 | Kind::Uint64 | Kind::Bool => 0,
        Kind::Sint32 | Kind::Sint64 => 1,
        Kind::Fixed32 | Kind::Sfixed32 => 2,
        Kind::Fixed64 | Kind::Sfixed64 => 3,
        Kind::String | Kind::Bytes => 4,
        Kind::Float => 5,
        Kind::Double => 6,
        Kind::Message(_) | Kind::Enum(_) => return None,
    })
}

fn length_delimited(k: &Kind) -> bool {
    matches!(k, Kind::String | Kind::Bytes | Kind::Message(_))
}

impl Diff {
    fn push(&mut self, c: Change, path: &str, detail: String) {
        self.out.push((c, path.to_string(), detail));
    }

    fn message(&mut self, path: &str, o: &MessageDescriptor, u: &MessageDescriptor) {
        let of: BTreeMap<u32, FieldDescriptor> = o.fields().map(|f| (f.number(), f)).collect();
        let uf: BTreeMap<u32, FieldDescriptor> = u.fields().map(|f| (f.number(), f)).collect();
        for (n, f) in &of {
            if !uf.contains_key(n) && f.is_required() {
                self.push(
                    Change::RequiredFieldRemoved,
                    &format!("{path}.{}", f.name()),
                    format!("required field {n} is gone"),
                );
            }
        }
        for (n, f) in &uf {
            match of.get(n) {
                None if f.is_required() => self.push(
                    Change::RequiredFieldAdded,
                    &format!("{path}.{}", f.name()),
                    format!("required field {n} is new"),
                ),
                None => {}
                Some(old) => self.field(&format!("{path}.{}", f.name()), old, f),
            }
        }
        // Oneofs (not proto3 optional's synthetic ones), by name, as sets of field numbers.
        let oneofs = |m: &MessageDescriptor| -> BTreeMap<String, BTreeSet<u32>> {
            m.oneofs()
                .filter(|o| !o.is_synthetic())
                .map(|o| {
                    (
                        o.name().to_string(),
                        o.fields().map(|f| f.number()).collect(),
                    )
                })
                .collect()
        };
        let (oo, uo) = (oneofs(o), oneofs(u));
        let in_old_oneof = |n: u32| oo.values().any(|s| s.contains(&n));
        for (name, old) in &oo {
            let Some(new) = uo.get(name) else { continue };
            for n in old.difference(new) {
                self.push(
                    Change::OneofFieldRemoved,
                    &format!("{path}.{name}"),
                    format!("field {n} left the oneof"),
                );
            }
            for n in new.difference(old) {
                if of.contains_key(n) && !in_old_oneof(*n) {
                    self.push(
                        Change::FieldMovedToExistingOneof,
                        &format!("{path}.{name}"),
                        format!("field {n} moved into the existing oneof"),
                    );
                }
            }
        }
        for (name, new) in &uo {
            if oo.contains_key(name) {
                continue;
            }
            let moved = new.iter().filter(|n| of.contains_key(n)).count();
            if moved > 1 {
                self.push(
                    Change::MultipleFieldsMovedToOneof,
                    &format!("{path}.{name}"),
                    format!("{moved} existing fields moved into the new oneof"),
                );
            }
        }
    }

    fn field(&mut self, path: &str, o: &FieldDescriptor, u: &FieldDescriptor) {
        if o.is_map() != u.is_map() {
            self.push(
                Change::FieldKindChanged,
                path,
                "changed between a map and another kind".into(),
            );
            return;
        }
        if o.is_map() {
            if let (Kind::Message(om), Kind::Message(um)) = (o.kind(), u.kind()) {
                let (ok, uk) = (om.map_entry_key_field(), um.map_entry_key_field());
                self.kind(&format!("{path}.key"), &ok, &uk);
                let (ov, uv) = (om.map_entry_value_field(), um.map_entry_value_field());
                self.kind(&format!("{path}.value"), &ov, &uv);
            }
            return;
        }
        let (ol, ul) = (label(o), label(u));
        if ol != ul {
            if ul == Label::Required {
                self.push(
                    Change::RequiredFieldAdded,
                    path,
                    "the field became required".into(),
                );
            } else if ol == Label::Required {
                self.push(
                    Change::RequiredFieldRemoved,
                    path,
                    "the field is no longer required".into(),
                );
            } else if !(length_delimited(&o.kind()) && length_delimited(&u.kind())) {
                self.push(
                    Change::FieldNumericLabelChanged,
                    path,
                    "a numeric field changed between single and repeated".into(),
                );
            }
        }
        self.kind(path, o, u);
    }

    fn kind(&mut self, path: &str, o: &FieldDescriptor, u: &FieldDescriptor) {
        let (ok, uk) = (o.kind(), u.kind());
        match (&ok, &uk) {
            (Kind::Message(om), Kind::Message(um)) => {
                let (on, un) = (
                    named(
                        om.full_name(),
                        &om.parent_file(),
                        o.parent_message().package_name(),
                    ),
                    named(
                        um.full_name(),
                        &um.parent_file(),
                        u.parent_message().package_name(),
                    ),
                );
                if on != un {
                    self.push(
                        Change::FieldNamedTypeChanged,
                        path,
                        format!("type {on} changed to {un}"),
                    );
                } else if om.parent_file().name() != MAIN_FILE
                    && self
                        .visited
                        .insert((om.full_name().to_string(), um.full_name().to_string()))
                {
                    // A referenced file's message is compared where it is used.
                    self.message(&on, om, um);
                }
            }
            (Kind::Enum(oe), Kind::Enum(ue)) => {
                let (on, un) = (
                    named(
                        oe.full_name(),
                        &oe.parent_file(),
                        o.parent_message().package_name(),
                    ),
                    named(
                        ue.full_name(),
                        &ue.parent_file(),
                        u.parent_message().package_name(),
                    ),
                );
                if on != un {
                    self.push(
                        Change::FieldNamedTypeChanged,
                        path,
                        format!("type {on} changed to {un}"),
                    );
                }
            }
            _ => match (wire_group(&ok), wire_group(&uk)) {
                (Some(a), Some(b)) if a == b => {}
                (Some(_), Some(_)) => self.push(
                    Change::FieldScalarKindChanged,
                    path,
                    format!("{} changed to {}", type_name(&ok), type_name(&uk)),
                ),
                _ => self.push(
                    Change::FieldKindChanged,
                    path,
                    format!("{} changed to {}", type_name(&ok), type_name(&uk)),
                ),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compile(text: &str) -> ProtoSchema {
        parse(text, &[]).unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    fn proto3(body: &str) -> ProtoSchema {
        compile(&format!("syntax = \"proto3\";\npackage acme;\n{body}"))
    }

    fn proto2(body: &str) -> ProtoSchema {
        compile(&format!("syntax = \"proto2\";\npackage acme;\n{body}"))
    }

    /// The incompatible change names from `old` to `new` (backward: `new` reads `old`'s data).
    fn changes(old: &ProtoSchema, new: &ProtoSchema) -> Vec<&'static str> {
        let mut names: Vec<&'static str> = diff(&old.file, &new.file)
            .into_iter()
            .map(|(c, _, _)| c.name())
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }

    #[test]
    fn text_and_descriptor_forms_of_one_schema_print_the_same_canonical_text() {
        let a = proto3(
            "import \"google/protobuf/timestamp.proto\";\n\
             message User { string name = 1; google.protobuf.Timestamp at = 2; Kind kind = 3;\n\
             map<string, int64> counts = 4; oneof contact { string email = 5; string phone = 6; }\n\
             optional int32 age = 7; repeated Address addresses = 8 [deprecated = true];\n\
             message Address { string city = 1; } }\n\
             enum Kind { KIND_UNKNOWN = 0; KIND_ADMIN = 1; }",
        );
        let canonical = a.canonical();
        // Compiled again from its own canonical text and from its descriptor.
        let b = compile(&canonical);
        assert_eq!(b.canonical(), canonical);
        let c = compile(&a.serialized());
        assert_eq!(c.canonical(), canonical);
        assert!(
            canonical.contains("map<string, int64> counts = 4;"),
            "{canonical}"
        );
        assert!(canonical.contains("optional int32 age = 7;"), "{canonical}");
        assert!(canonical.contains("oneof contact {"), "{canonical}");
        assert!(
            canonical.contains(".google.protobuf.Timestamp at = 2;"),
            "{canonical}"
        );
        assert!(
            canonical.contains("repeated .acme.User.Address addresses = 8 [deprecated = true];"),
            "{canonical}"
        );
    }

    #[test]
    fn layout_and_comments_do_not_change_the_canonical_text() {
        let a = proto3("message M { string a = 1; int32 b = 2; }");
        let b = compile(
            "// a comment\nsyntax   =  \"proto3\" ;\n\npackage acme ;\nmessage M {\n  string a = 1; // here\n\n  int32 b = 2;\n}\n",
        );
        assert_eq!(a.canonical(), b.canonical());
    }

    #[test]
    fn proto2_defaults_groups_required_and_extensions_survive_printing() {
        let a = proto2(
            "message M { required string a = 1 [default = \"x\\\"y\"]; optional int32 b = 2 [default = -3];\n\
             optional group G = 3 { optional int32 c = 1; }\n extensions 100 to max; reserved 5, 8 to 9; reserved \"old\"; }\n\
             extend M { optional string note = 100; }",
        );
        let text = a.canonical();
        assert_eq!(compile(&text).canonical(), text, "{text}");
        assert!(
            text.contains("required string a = 1 [default = \"x\\\"y\"];"),
            "{text}"
        );
        assert!(text.contains("optional group G = 3 {"), "{text}");
        assert!(text.contains("extensions 100 to max;"), "{text}");
        assert!(text.contains("reserved 5, 8 to 9;"), "{text}");
        assert!(text.contains("extend .acme.M {"), "{text}");
    }

    #[test]
    fn imports_resolve_through_references_and_well_known_types_without_them() {
        let dep = Resolved {
            name: "acme/address.proto".into(),
            schema_type: SchemaType::Protobuf,
            text: "syntax = \"proto3\"; package acme; message Address { string city = 1; }".into(),
        };
        let text = "syntax = \"proto3\"; package acme; import \"acme/address.proto\";\n\
                    import \"google/protobuf/wrappers.proto\";\n\
                    message Person { Address home = 1; google.protobuf.StringValue nick = 2; }";
        let p = parse(text, std::slice::from_ref(&dep)).unwrap();
        assert!(p.canonical().contains(".acme.Address home = 1;"));
        let missing = parse(text, &[]).unwrap_err();
        assert!(missing.contains("acme/address.proto"), "{missing}");
        // A referenced file may come as a descriptor, as Confluent's serializers send it.
        let as_descriptor = Resolved {
            text: parse(&dep.text, &[]).unwrap().serialized(),
            ..dep
        };
        assert!(parse(text, &[as_descriptor]).is_ok());
    }

    #[test]
    fn custom_options_survive_the_descriptor_form() {
        let p = proto3(
            "import \"google/protobuf/descriptor.proto\";\n\
             extend google.protobuf.FieldOptions { string tag = 50001; }\n\
             message M { string s = 1 [(tag) = \"x\", deprecated = true]; }",
        );
        let text = p.canonical();
        assert!(
            text.contains("string s = 1 [deprecated = true, (acme.tag) = \"x\"];"),
            "{text}"
        );
        assert_eq!(compile(&p.serialized()).canonical(), text);
        assert_eq!(compile(&text).canonical(), text);
    }

    #[test]
    fn invalid_text_is_refused_with_the_compilers_message() {
        for bad in [
            "syntax = \"proto3\"; message M { string a = 1; int32 b = 1; }",
            "syntax = \"proto3\"; message M { Unknown a = 1; }",
            "syntax = \"proto3\"; message M { required string a = 1; }",
            "this is not protobuf",
            "{\"type\": \"record\"}",
            "edition = \"2023\"; message M { string s = 1; }",
        ] {
            assert!(parse(bad, &[]).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn json_records_encode_with_the_first_message() {
        let p = proto3("message M { string name = 1; int64 n = 2; repeated string tags = 3; }");
        let m = p.first_message().unwrap();
        let bytes = ProtoSchema::encode_json(&m, r#"{"name":"a","n":"5","tags":["x"]}"#).unwrap();
        assert_eq!(bytes, vec![0x0a, 1, b'a', 0x10, 5, 0x1a, 1, b'x']);
        assert!(ProtoSchema::encode_json(&m, r#"{"name":5}"#).is_err());
        assert!(ProtoSchema::encode_json(&m, r#"{"nope":1}"#).is_err());
    }

    /// (change, old body, new body, incompatible changes expected) — backward: the new schema
    /// reads data written with the old one. Forward is the same table read the other way.
    const TABLE: &[(&str, &str, &str, &[&str])] = &[
        (
            "add a field",
            "message M { string a = 1; }",
            "message M { string a = 1; int32 b = 2; }",
            &[],
        ),
        (
            "remove a field",
            "message M { string a = 1; int32 b = 2; }",
            "message M { string a = 1; }",
            &[],
        ),
        (
            "rename a field",
            "message M { string a = 1; }",
            "message M { string b = 1; }",
            &[],
        ),
        (
            "reuse a field number with another wire type",
            "message M { string a = 1; }",
            "message M { int32 a = 1; }",
            &["FIELD_SCALAR_KIND_CHANGED"],
        ),
        (
            "int32 to int64 (both varints)",
            "message M { int32 a = 1; }",
            "message M { int64 a = 1; }",
            &[],
        ),
        (
            "uint64 to bool (both varints)",
            "message M { uint64 a = 1; }",
            "message M { bool a = 1; }",
            &[],
        ),
        (
            "sint32 to int32 (zigzag against plain varint)",
            "message M { sint32 a = 1; }",
            "message M { int32 a = 1; }",
            &["FIELD_SCALAR_KIND_CHANGED"],
        ),
        (
            "fixed32 to sfixed32",
            "message M { fixed32 a = 1; }",
            "message M { sfixed32 a = 1; }",
            &[],
        ),
        (
            "fixed64 to double",
            "message M { fixed64 a = 1; }",
            "message M { double a = 1; }",
            &["FIELD_SCALAR_KIND_CHANGED"],
        ),
        (
            "string to bytes",
            "message M { string a = 1; }",
            "message M { bytes a = 1; }",
            &[],
        ),
        (
            "scalar to message",
            "message M { string a = 1; } message N { string s = 1; }",
            "message M { N a = 1; } message N { string s = 1; }",
            &["FIELD_KIND_CHANGED"],
        ),
        (
            "message to another message",
            "message M { N a = 1; } message N { string s = 1; } message O { string s = 1; }",
            "message M { O a = 1; } message N { string s = 1; } message O { string s = 1; }",
            &["FIELD_NAMED_TYPE_CHANGED"],
        ),
        (
            "enum to int32",
            "message M { E a = 1; } enum E { Z = 0; }",
            "message M { int32 a = 1; } enum E { Z = 0; }",
            &["FIELD_KIND_CHANGED"],
        ),
        (
            "map to repeated message",
            "message M { map<string, string> a = 1; }",
            "message M { repeated E a = 1; message E { string key = 1; string value = 2; } }",
            &["FIELD_KIND_CHANGED"],
        ),
        (
            "map value type changed",
            "message M { map<string, string> a = 1; }",
            "message M { map<string, int32> a = 1; }",
            &["FIELD_SCALAR_KIND_CHANGED"],
        ),
        (
            "string made repeated",
            "message M { string a = 1; }",
            "message M { repeated string a = 1; }",
            &[],
        ),
        (
            "int32 made repeated",
            "message M { int32 a = 1; }",
            "message M { repeated int32 a = 1; }",
            &["FIELD_NUMERIC_LABEL_CHANGED"],
        ),
        (
            "remove a message",
            "message M { string a = 1; } message N { string b = 1; }",
            "message M { string a = 1; }",
            &["MESSAGE_REMOVED"],
        ),
        (
            "add a message",
            "message M { string a = 1; }",
            "message M { string a = 1; } message N { string b = 1; }",
            &[],
        ),
        (
            "move a message into another",
            "message M { string a = 1; } message N { string b = 1; }",
            "message M { string a = 1; message N { string b = 1; } }",
            &[],
        ),
        (
            "remove an enum",
            "message M { string a = 1; } enum E { Z = 0; }",
            "message M { string a = 1; }",
            &[],
        ),
        (
            "add and remove enum constants",
            "message M { E a = 1; } enum E { Z = 0; A = 1; }",
            "message M { E a = 1; } enum E { Z = 0; B = 2; }",
            &[],
        ),
        (
            "add a oneof of new fields",
            "message M { string a = 1; }",
            "message M { string a = 1; oneof o { int32 b = 2; string c = 3; } }",
            &[],
        ),
        (
            "add a field to a oneof",
            "message M { oneof o { int32 b = 2; } }",
            "message M { oneof o { int32 b = 2; string c = 3; } }",
            &[],
        ),
        (
            "remove a field from a oneof",
            "message M { oneof o { int32 b = 2; string c = 3; } }",
            "message M { oneof o { int32 b = 2; } }",
            &["ONEOF_FIELD_REMOVED"],
        ),
        (
            "move one existing field into a new oneof",
            "message M { int32 b = 2; }",
            "message M { oneof o { int32 b = 2; } }",
            &[],
        ),
        (
            "move two existing fields into a new oneof",
            "message M { int32 b = 2; string c = 3; }",
            "message M { oneof o { int32 b = 2; string c = 3; } }",
            &["MULTIPLE_FIELDS_MOVED_TO_ONEOF"],
        ),
        (
            "move an existing field into an existing oneof",
            "message M { string c = 3; oneof o { int32 b = 2; } }",
            "message M { oneof o { int32 b = 2; string c = 3; } }",
            &["FIELD_MOVED_TO_EXISTING_ONEOF"],
        ),
        (
            "remove a oneof (its fields stay)",
            "message M { oneof o { int32 b = 2; } }",
            "message M { int32 b = 2; }",
            &[],
        ),
        (
            "change the package",
            "message M { string a = 1; }",
            "package other; message M { string a = 1; }",
            &[],
        ),
        (
            "nested message field changed",
            "message M { N n = 1; message N { string s = 1; } }",
            "message M { N n = 1; message N { int64 s = 1; } }",
            &["FIELD_SCALAR_KIND_CHANGED"],
        ),
    ];

    #[test]
    fn the_table_of_changes_gets_confluents_verdicts() {
        for (what, old, new, want) in TABLE {
            // "package other;" in the new body replaces the package (a second package
            // statement is an error).
            let new_text = match new.strip_prefix("package other; ") {
                Some(rest) => compile(&format!("syntax = \"proto3\";\npackage other;\n{rest}")),
                None => proto3(new),
            };
            let got = changes(&proto3(old), &new_text);
            assert_eq!(&got, want, "{what}");
        }
    }

    #[test]
    fn proto2_required_fields_cannot_come_or_go() {
        let old = proto2("message M { optional string a = 1; }");
        let added = proto2("message M { optional string a = 1; required int32 b = 2; }");
        assert_eq!(changes(&old, &added), vec!["REQUIRED_FIELD_ADDED"]);
        assert_eq!(changes(&added, &old), vec!["REQUIRED_FIELD_REMOVED"]);
        let made_required = proto2("message M { required string a = 1; }");
        assert_eq!(changes(&old, &made_required), vec!["REQUIRED_FIELD_ADDED"]);
        // Optional fields come and go freely.
        let more = proto2("message M { optional string a = 1; optional int32 b = 2; }");
        assert!(changes(&old, &more).is_empty() && changes(&more, &old).is_empty());
    }

    #[test]
    fn a_syntax_change_alone_is_compatible() {
        let p2 =
            proto2("message M { optional string a = 1; repeated int32 b = 2 [packed = true]; }");
        let p3 = proto3("message M { string a = 1; repeated int32 b = 2; }");
        assert!(changes(&p2, &p3).is_empty(), "{:?}", changes(&p2, &p3));
        assert!(changes(&p3, &p2).is_empty());
    }

    #[test]
    fn messages_name_the_change_the_path_and_what_changed() {
        let old = proto3("message M { string a = 1; }");
        let new = proto3("message M { int32 a = 1; }");
        let msgs = incompatibilities(&new, &old);
        assert_eq!(
            msgs,
            vec!["FIELD_SCALAR_KIND_CHANGED at M.a: string changed to int32".to_string()]
        );
    }

    #[test]
    fn a_recursive_message_in_a_referenced_file_is_compared_once() {
        let dep = |t: &str| Resolved {
            name: "tree.proto".into(),
            schema_type: SchemaType::Protobuf,
            text: format!(
                "syntax = \"proto3\"; package t; message Node {{ {t} repeated Node kids = 2; }}"
            ),
        };
        let main = "syntax = \"proto3\"; import \"tree.proto\"; message M { t.Node root = 1; }";
        let old = parse(main, &[dep("string v = 1;")]).unwrap();
        let new = parse(main, &[dep("int64 v = 1;")]).unwrap();
        let got = changes(&old, &new);
        assert_eq!(got, vec!["FIELD_SCALAR_KIND_CHANGED"]);
    }
}
