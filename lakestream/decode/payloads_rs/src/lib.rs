//! Debezium payloads parsed straight into Arrow buffers.
//!
//! `lakestream.decode.native` hands this library a run of schemas-on JSON envelopes of one topic (joined, with their
//! offsets), the row's fields and their wire kinds, and buffers it allocated; the library checks every envelope
//! carries the first one's schema part byte for byte, parses each `payload` object and fills the buffers: a validity
//! byte and a value per row and field, of `after` (every field) and `before` (the fields asked for: a delete's key),
//! the op, `source.ts_ms` and `ts_ms`.
//!
//! It never decides that a record is bad. Anything it does not take as it is — a syntax error, a value of another
//! kind, an integer that does not fit 64 bits, a duplicate field, an escaped field name, a lone surrogate, invalid
//! UTF-8, an op other than c/u/r/d, nesting deeper than 64 — makes it return a negative code, and the caller decodes
//! the run record by record, which names the bad record in a dead letter.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::slice;

pub const KIND_INT: u8 = 0;
pub const KIND_FLOAT: u8 = 1;
pub const KIND_BOOL: u8 = 2;
pub const KIND_STRING: u8 = 3;

const DECLINE_SYNTAX: i32 = -1;
const DECLINE_KIND: i32 = -2;
const DECLINE_DUPLICATE: i32 = -3;
const DECLINE_ENVELOPE: i32 = -4;
const DECLINE_OP: i32 = -5;
const DECLINE_UTF8: i32 = -6;
const DECLINE_RANGE: i32 = -7;
const DECLINE_ESCAPED_NAME: i32 = -8;
const DECLINE_DEPTH: i32 = -9;
const DECLINE_CAPACITY: i32 = -10;
const DECLINE_PANIC: i32 = -100;

const MAX_DEPTH: u32 = 64;

type Parsed<T> = Result<T, i32>;

/// One field of one side (`before` or `after`), as the caller allocated it. A null `valid` means the field is not
/// read on that side: its values are skipped (and still checked to be JSON).
#[repr(C)]
pub struct Column {
    pub kind: u8,
    pub valid: *mut u8,   // one byte per row: 1 when the value is present and not null
    pub values: *mut u8,  // int: i64 per row; float: f64 per row; bool: one byte per row; string: i32 offsets, n + 1
    pub data: *mut u8,    // string: the UTF-8 bytes
    pub capacity: i64,    // string: the size of `data`
    pub used: i64,        // out, string: the bytes written
}

/// The top-level outputs, one per row each.
#[repr(C)]
pub struct Envelope {
    pub after_valid: *mut u8,
    pub before_valid: *mut u8,
    pub op: *mut u8,
    pub source_valid: *mut u8,
    pub source_ts: *mut i64,
    pub source_ts_valid: *mut u8,
    pub ts_ms: *mut i64,
    pub ts_ms_valid: *mut u8,
}

struct Field<'a> {
    name: &'a [u8],
    after: &'a mut Column,
    before: &'a mut Column,
}

struct Cursor<'a> {
    b: &'a [u8],
    i: usize,
}

#[inline]
fn is_ws(c: u8) -> bool {
    c == b' ' || c == b'\n' || c == b'\r' || c == b'\t'
}

impl<'a> Cursor<'a> {
    #[inline]
    fn ws(&mut self) {
        while self.i < self.b.len() && is_ws(self.b[self.i]) {
            self.i += 1;
        }
    }

    #[inline]
    fn peek(&self) -> Parsed<u8> {
        self.b.get(self.i).copied().ok_or(DECLINE_SYNTAX)
    }

    #[inline]
    fn expect(&mut self, c: u8) -> Parsed<()> {
        if self.peek()? == c {
            self.i += 1;
            Ok(())
        } else {
            Err(DECLINE_SYNTAX)
        }
    }

    #[inline]
    fn literal(&mut self, word: &[u8]) -> Parsed<()> {
        if self.b[self.i..].starts_with(word) {
            self.i += word.len();
            Ok(())
        } else {
            Err(DECLINE_SYNTAX)
        }
    }

    /// A field name: the bytes between its quotes (an escaped name declines: Debezium never writes one).
    #[inline]
    fn name(&mut self) -> Parsed<&'a [u8]> {
        self.expect(b'"')?;
        let start = self.i;
        while self.i < self.b.len() {
            let c = self.b[self.i];
            if c == b'"' {
                let name = &self.b[start..self.i];
                self.i += 1;
                return Ok(name);
            }
            if c == b'\\' {
                return Err(DECLINE_ESCAPED_NAME);
            }
            if c < 0x20 {
                return Err(DECLINE_SYNTAX);
            }
            self.i += 1;
        }
        Err(DECLINE_SYNTAX)
    }

    /// A string, unescaped into `out` from `at` on (None: checked and dropped); returns the end in `out`.
    fn string(&mut self, mut out: Option<&mut [u8]>, mut at: usize) -> Parsed<usize> {
        self.expect(b'"')?;
        let begin = at;
        loop {
            let start = self.i;
            while self.i < self.b.len() {
                let c = self.b[self.i];
                if c == b'"' || c == b'\\' || c < 0x20 {
                    break;
                }
                self.i += 1;
            }
            let run = &self.b[start..self.i];
            if let Some(buf) = out.as_deref_mut() {
                let end = at + run.len();
                if end > buf.len() {
                    return Err(DECLINE_CAPACITY);
                }
                buf[at..end].copy_from_slice(run);
                at = end;
            } else if !run.is_ascii() && std::str::from_utf8(run).is_err() {
                return Err(DECLINE_UTF8);
            }
            let c = self.peek()?;
            self.i += 1;
            match c {
                b'"' => break,
                b'\\' => {
                    let mut code = [0u8; 4];
                    let bytes: &[u8] = match self.peek()? {
                        b'"' => b"\"",
                        b'\\' => b"\\",
                        b'/' => b"/",
                        b'b' => b"\x08",
                        b'f' => b"\x0c",
                        b'n' => b"\n",
                        b'r' => b"\r",
                        b't' => b"\t",
                        b'u' => {
                            self.i += 1;
                            let ch = self.unicode_escape()?;
                            self.i -= 1; // the shared step below moves past the escape's last byte
                            ch.encode_utf8(&mut code).as_bytes()
                        }
                        _ => return Err(DECLINE_SYNTAX),
                    };
                    self.i += 1;
                    if let Some(buf) = out.as_deref_mut() {
                        let end = at + bytes.len();
                        if end > buf.len() {
                            return Err(DECLINE_CAPACITY);
                        }
                        buf[at..end].copy_from_slice(bytes);
                        at = end;
                    }
                }
                _ => return Err(DECLINE_SYNTAX), // a control character inside a string
            }
        }
        if let Some(buf) = out {
            let written = &buf[begin..at];
            if !written.is_ascii() && std::str::from_utf8(written).is_err() {
                return Err(DECLINE_UTF8);
            }
        }
        Ok(at)
    }

    fn hex4(&mut self) -> Parsed<u32> {
        let digits = self.b.get(self.i..self.i + 4).ok_or(DECLINE_SYNTAX)?;
        let mut v = 0u32;
        for &d in digits {
            let x = match d {
                b'0'..=b'9' => d - b'0',
                b'a'..=b'f' => d - b'a' + 10,
                b'A'..=b'F' => d - b'A' + 10,
                _ => return Err(DECLINE_SYNTAX),
            };
            v = v * 16 + x as u32;
        }
        self.i += 4;
        Ok(v)
    }

    /// The character of a `\uXXXX` escape (the cursor after the `u`), a surrogate pair joined; a lone surrogate
    /// declines (the record path's parser refuses it too).
    fn unicode_escape(&mut self) -> Parsed<char> {
        let high = self.hex4()?;
        if (0xDC00..0xE000).contains(&high) {
            return Err(DECLINE_UTF8);
        }
        if (0xD800..0xDC00).contains(&high) {
            if self.b.get(self.i..self.i + 2) != Some(b"\\u") {
                return Err(DECLINE_UTF8);
            }
            self.i += 2;
            let low = self.hex4()?;
            if !(0xDC00..0xE000).contains(&low) {
                return Err(DECLINE_UTF8);
            }
            let code = 0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00);
            return char::from_u32(code).ok_or(DECLINE_UTF8);
        }
        char::from_u32(high).ok_or(DECLINE_UTF8)
    }

    /// A number as JSON's grammar has it: its text, and whether it is an integer literal (no fraction, no exponent).
    fn number(&mut self) -> Parsed<(&'a [u8], bool)> {
        let start = self.i;
        if self.peek()? == b'-' {
            self.i += 1;
        }
        match self.peek()? {
            b'0' => self.i += 1,
            b'1'..=b'9' => self.digits(),
            _ => return Err(DECLINE_SYNTAX),
        }
        let mut integer = true;
        if self.b.get(self.i) == Some(&b'.') {
            self.i += 1;
            self.some_digits()?;
            integer = false;
        }
        if matches!(self.b.get(self.i), Some(b'e') | Some(b'E')) {
            self.i += 1;
            if matches!(self.b.get(self.i), Some(b'+') | Some(b'-')) {
                self.i += 1;
            }
            self.some_digits()?;
            integer = false;
        }
        Ok((&self.b[start..self.i], integer))
    }

    #[inline]
    fn digits(&mut self) {
        while self.i < self.b.len() && self.b[self.i].is_ascii_digit() {
            self.i += 1;
        }
    }

    fn some_digits(&mut self) -> Parsed<()> {
        let start = self.i;
        self.digits();
        if self.i == start {
            Err(DECLINE_SYNTAX)
        } else {
            Ok(())
        }
    }

    fn int(&mut self) -> Parsed<i64> {
        let (text, integer) = self.number()?;
        if !integer {
            return Err(DECLINE_KIND);
        }
        // SAFETY of the unchecked conversion: the grammar above admits only ASCII.
        let text = unsafe { std::str::from_utf8_unchecked(text) };
        text.parse::<i64>().map_err(|_| DECLINE_RANGE)
    }

    fn float(&mut self) -> Parsed<f64> {
        let (text, _) = self.number()?;
        let text = unsafe { std::str::from_utf8_unchecked(text) };
        let v = text.parse::<f64>().map_err(|_| DECLINE_SYNTAX)?;
        if v.is_finite() {
            Ok(v)
        } else {
            Err(DECLINE_RANGE)
        }
    }

    /// The items of an array or the members of an object, the cursor at its opening bracket: each item handed to
    /// `item` (which must consume it), separated by commas, up to `close`.
    fn sequence(&mut self, close: u8, mut item: impl FnMut(&mut Self) -> Parsed<()>) -> Parsed<()> {
        self.i += 1;
        self.ws();
        if self.peek()? == close {
            self.i += 1;
            return Ok(());
        }
        loop {
            self.ws();
            item(self)?;
            self.ws();
            match self.peek()? {
                b',' => self.i += 1,
                c if c == close => {
                    self.i += 1;
                    return Ok(());
                }
                _ => return Err(DECLINE_SYNTAX),
            }
        }
    }

    /// An object whose members are each handed to `member` (its name, the cursor at its value, which `member` must
    /// consume). Names are read as `name` reads them: an escaped one declines.
    fn members(&mut self, mut member: impl FnMut(&mut Self, &'a [u8]) -> Parsed<()>) -> Parsed<()> {
        if self.peek()? != b'{' {
            return Err(DECLINE_SYNTAX);
        }
        self.sequence(b'}', |cur| {
            let name = cur.name()?;
            cur.ws();
            cur.expect(b':')?;
            cur.ws();
            member(cur, name)
        })
    }

    /// Any JSON value, checked and dropped.
    fn skip(&mut self, depth: u32) -> Parsed<()> {
        if depth > MAX_DEPTH {
            return Err(DECLINE_DEPTH);
        }
        match self.peek()? {
            b'{' => self.sequence(b'}', |cur| {
                cur.string(None, 0)?; // any name, escapes and all: the value is dropped
                cur.ws();
                cur.expect(b':')?;
                cur.ws();
                cur.skip(depth + 1)
            }),
            b'[' => self.sequence(b']', |cur| cur.skip(depth + 1)),
            b'"' => self.string(None, 0).map(|_| ()),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => self.number().map(|_| ()),
        }
    }

    /// `null`, consumed (true), or something else, left (false).
    #[inline]
    fn null(&mut self) -> Parsed<bool> {
        if self.peek()? == b'n' {
            self.literal(b"null")?;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// An integer or null, where the payload has one (`ts_ms`, `source.ts_ms`).
    fn optional_int(&mut self, row: usize, values: *mut i64, valid: *mut u8) -> Parsed<()> {
        if self.null()? {
            return Ok(());
        }
        let v = self.int()?;
        unsafe {
            *values.add(row) = v;
            *valid.add(row) = 1;
        }
        Ok(())
    }
}

/// The value of one field of one side at `row`, into its column.
fn value(cur: &mut Cursor, col: &mut Column, row: usize) -> Parsed<()> {
    if col.valid.is_null() {
        return cur.skip(1);
    }
    if cur.null()? {
        if col.kind == KIND_STRING {
            let offsets = col.values as *mut i32;
            unsafe { *offsets.add(row + 1) = col.used as i32 };
        }
        return Ok(());
    }
    unsafe {
        match col.kind {
            KIND_INT => *(col.values as *mut i64).add(row) = cur.int()?,
            KIND_FLOAT => {
                if !matches!(cur.peek()?, b'-' | b'0'..=b'9') {
                    return Err(DECLINE_KIND);
                }
                *(col.values as *mut f64).add(row) = cur.float()?
            }
            KIND_BOOL => {
                let v = match cur.peek()? {
                    b't' => {
                        cur.literal(b"true")?;
                        1
                    }
                    b'f' => {
                        cur.literal(b"false")?;
                        0
                    }
                    _ => return Err(DECLINE_KIND),
                };
                *col.values.add(row) = v;
            }
            KIND_STRING => {
                if cur.peek()? != b'"' {
                    return Err(DECLINE_KIND);
                }
                let buf = slice::from_raw_parts_mut(col.data, col.capacity as usize);
                let end = cur.string(Some(buf), col.used as usize)?;
                if end > i32::MAX as usize {
                    return Err(DECLINE_CAPACITY);
                }
                col.used = end as i64;
                *(col.values as *mut i32).add(row + 1) = end as i32;
            }
            _ => return Err(DECLINE_KIND),
        }
        *col.valid.add(row) = 1;
    }
    Ok(())
}

/// A string column's offset for a row where the field is absent (a null value, an absent side).
#[inline]
fn close_string(col: &mut Column, row: usize) {
    if col.kind == KIND_STRING && !col.valid.is_null() {
        unsafe {
            let offsets = col.values as *mut i32;
            let here = offsets.add(row + 1);
            if *here < *offsets.add(row) {
                *here = *offsets.add(row);
            }
        }
    }
}

/// `before` or `after` at `row`: null, or an object whose fields go to their columns (`seen` catches duplicates).
fn side(
    cur: &mut Cursor,
    fields: &mut [Field],
    after: bool,
    row: usize,
    valid: *mut u8,
    seen: &mut [u32],
    stamp: u32,
) -> Parsed<()> {
    if !cur.null()? {
        unsafe { *valid.add(row) = 1 };
        let mut guess = 0usize; // Debezium writes the fields in the schema's order: try the next one first
        cur.members(|cur, name| {
            let found = if guess < fields.len() && fields[guess].name == name {
                Some(guess)
            } else {
                fields.iter().position(|f| f.name == name)
            };
            match found {
                Some(f) => {
                    if seen[f] == stamp {
                        return Err(DECLINE_DUPLICATE);
                    }
                    seen[f] = stamp;
                    let field = &mut fields[f];
                    let col = if after { &mut *field.after } else { &mut *field.before };
                    guess = f + 1;
                    value(cur, col, row)
                }
                None => cur.skip(1), // a field the run's schema has but the table does not read
            }
        })?;
    }
    for field in fields.iter_mut() {
        close_string(if after { field.after } else { field.before }, row);
    }
    Ok(())
}

/// `source` at `row`: null, or an object of which only `ts_ms` is read.
fn source(cur: &mut Cursor, out: &Envelope, row: usize) -> Parsed<()> {
    if cur.null()? {
        return Ok(());
    }
    unsafe { *out.source_valid.add(row) = 1 };
    let mut seen = false;
    cur.members(|cur, name| {
        if name != b"ts_ms" {
            return cur.skip(1);
        }
        if seen {
            return Err(DECLINE_DUPLICATE);
        }
        seen = true;
        cur.optional_int(row, out.source_ts, out.source_ts_valid)
    })
}

/// One payload object at `row`.
fn payload(cur: &mut Cursor, fields: &mut [Field], out: &Envelope, row: usize, seen: &mut [u32]) -> Parsed<()> {
    let stamp_after = 2 * row as u32 + 1;
    let stamp_before = 2 * row as u32 + 2;
    let mut known = 0u8; // before, after, op, source, ts_ms: a second one declines
    let mut mark = |bit: u8| -> Parsed<()> {
        if known & bit != 0 {
            return Err(DECLINE_DUPLICATE);
        }
        known |= bit;
        Ok(())
    };
    cur.ws();
    cur.members(|cur, name| match name {
        b"before" => {
            mark(1)?;
            side(cur, fields, false, row, out.before_valid, seen, stamp_before)
        }
        b"after" => {
            mark(2)?;
            side(cur, fields, true, row, out.after_valid, seen, stamp_after)
        }
        b"op" => {
            mark(4)?;
            if cur.null()? {
                return Err(DECLINE_OP);
            }
            let op = cur.name()?;
            match op {
                b"c" | b"u" | b"r" | b"d" => {
                    unsafe { *out.op.add(row) = op[0] };
                    Ok(())
                }
                _ => Err(DECLINE_OP),
            }
        }
        b"source" => {
            mark(8)?;
            source(cur, out, row)
        }
        b"ts_ms" => {
            mark(16)?;
            cur.optional_int(row, out.ts_ms, out.ts_ms_valid)
        }
        _ => cur.skip(1),
    })?;
    if known & 4 == 0 {
        return Err(DECLINE_OP);
    }
    if known & 1 == 0 {
        for field in fields.iter_mut() {
            close_string(field.before, row);
        }
    }
    if known & 2 == 0 {
        for field in fields.iter_mut() {
            close_string(field.after, row);
        }
    }
    cur.ws();
    if cur.i != cur.b.len() {
        return Err(DECLINE_SYNTAX);
    }
    Ok(())
}

/// A Python object, opaque here: the caller's list of `bytes`, read through CPython's stable C API (the library is
/// loaded with `ctypes.PyDLL`, so the calls below run holding the interpreter lock).
#[repr(C)]
pub struct PyObject {
    _private: [u8; 0],
}

extern "C" {
    fn PyList_Size(list: *mut PyObject) -> isize;
    fn PyList_GetItem(list: *mut PyObject, index: isize) -> *mut PyObject;
    fn PyBytes_AsStringAndSize(obj: *mut PyObject, buffer: *mut *mut u8, length: *mut isize) -> i32;
    fn PyErr_Clear();
}

/// The items of a Python list of `bytes` as slices (None when the list holds anything else). They live as long as
/// the caller holds the list.
unsafe fn byte_strings<'a>(list: *mut PyObject) -> Option<Vec<&'a [u8]>> {
    let n = PyList_Size(list);
    if n < 0 {
        PyErr_Clear();
        return None;
    }
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n {
        let item = PyList_GetItem(list, i);
        let mut buffer: *mut u8 = std::ptr::null_mut();
        let mut length: isize = 0;
        if item.is_null() || PyBytes_AsStringAndSize(item, &mut buffer, &mut length) != 0 {
            PyErr_Clear();
            return None;
        }
        out.push(slice::from_raw_parts(buffer as *const u8, length as usize));
    }
    Some(out)
}

/// Whether every item of `keys` (a Python list) is `bytes` that starts with `head` and, past trailing whitespace,
/// ends with `}`: the schemas-on message keys the record path takes by their schema part alone.
///
/// # Safety
/// `keys` must be a list; `head` must point to `head_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn lakestream_keys_share_head(keys: *mut PyObject, head: *const u8, head_len: usize) -> i32 {
    let head = slice::from_raw_parts(head, head_len);
    let keys = match byte_strings(keys) {
        Some(keys) => keys,
        None => return 0,
    };
    let all = keys.iter().all(|k| {
        let end = k.iter().rposition(|&c| !is_ws(c) && c != 0x0b && c != 0x0c);
        k.starts_with(head) && end.map_or(false, |e| k[e] == b'}')
    });
    all as i32
}

/// Parses the envelopes of `values` (a Python list of `bytes`), whose payload starts `prefix_len` bytes in and ends
/// one byte before the value's end, into `after` and `before` (`nfields` columns each, named by `names` split at
/// `name_offsets`) and `out`. Every buffer is the caller's, zeroed, one entry per row (string offsets n + 1). Returns
/// 0, or a negative code with the row that declined in `*failed_row`.
///
/// # Safety
/// `values` must be a list; every other pointer must point to a buffer of the size described, valid for the call.
#[no_mangle]
pub unsafe extern "C" fn lakestream_parse_envelopes(
    values: *mut PyObject,
    prefix_len: usize,
    names: *const u8,
    name_offsets: *const i64,
    nfields: usize,
    after: *mut Column,
    before: *mut Column,
    out: *const Envelope,
    failed_row: *mut i64,
) -> i32 {
    let values = match byte_strings(values) {
        Some(values) => values,
        None => return DECLINE_ENVELOPE,
    };
    let result = catch_unwind(AssertUnwindSafe(|| {
        let name_offsets = slice::from_raw_parts(name_offsets, nfields + 1);
        let names = slice::from_raw_parts(names, name_offsets[nfields] as usize);
        let after = slice::from_raw_parts_mut(after, nfields);
        let before = slice::from_raw_parts_mut(before, nfields);
        let mut fields: Vec<Field> = after
            .iter_mut()
            .zip(before.iter_mut())
            .enumerate()
            .map(|(f, (a, b))| Field {
                name: &names[name_offsets[f] as usize..name_offsets[f + 1] as usize],
                after: a,
                before: b,
            })
            .collect();
        let out = &*out;
        let mut seen = vec![0u32; nfields];
        let first = match values.first() {
            Some(first) => first,
            None => return Err((0, DECLINE_ENVELOPE)),
        };
        if first.len() < prefix_len + 1 {
            return Err((0, DECLINE_ENVELOPE));
        }
        let prefix = &first[..prefix_len];
        for (row, value) in values.iter().enumerate() {
            if value.len() < prefix_len + 1 || &value[..prefix_len] != prefix || value[value.len() - 1] != b'}' {
                return Err((row, DECLINE_ENVELOPE));
            }
            let mut cur = Cursor { b: &value[prefix_len..value.len() - 1], i: 0 };
            payload(&mut cur, &mut fields, out, row, &mut seen).map_err(|code| (row, code))?;
        }
        Ok(())
    }));
    match result {
        Ok(Ok(())) => 0,
        Ok(Err((row, code))) => {
            *failed_row = row as i64;
            code
        }
        Err(_) => DECLINE_PANIC,
    }
}
