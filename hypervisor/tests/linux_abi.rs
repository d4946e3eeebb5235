//! The linux platform's ioctl numbers and struct layouts against the kernel's uapi
//! headers on this machine: a C program compiled with <xen/gntalloc.h>, <xen/gntdev.h>
//! and <xen/evtchn.h> prints every fact `xmx_hv::linux::abi::abi_facts` states, and
//! the two lists must agree exactly.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use xmx_hv::linux::abi::abi_facts;

/// The C expression that computes a fact, from its name.
fn c_expression(name: &str) -> String {
    if let Some(rest) = name.strip_prefix("alignof(") {
        format!("_Alignof({rest}")
    } else if let Some(rest) = name.strip_prefix("offsetof(") {
        // "offsetof(struct x,field)" -> "offsetof(struct x, field)"
        rest.split_once(',')
            .map(|(ty, field)| format!("offsetof({ty}, {field}"))
            .unwrap_or_else(|| name.to_string())
    } else {
        name.to_string()
    }
}

fn c_program() -> String {
    let mut src = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <stdint.h>\n#include <sys/ioctl.h>\n\
         /* The uapi headers use Xen's own typedefs without defining them. */\n\
         typedef uint16_t domid_t;\ntypedef uint32_t grant_ref_t;\n\
         #include <xen/gntalloc.h>\n#include <xen/gntdev.h>\n#include <xen/evtchn.h>\n\
         int main(void) {\n",
    );
    for fact in abi_facts() {
        src.push_str(&format!(
            "    printf(\"%s=%lld\\n\", \"{}\", (long long)({}));\n",
            fact.name,
            c_expression(fact.name)
        ));
    }
    src.push_str("    return 0;\n}\n");
    src
}

fn run_c_program() -> BTreeMap<String, i128> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("linux-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("abi.c");
    let bin = dir.join("abi");
    std::fs::write(&src, c_program()).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .arg("-std=gnu11")
        .arg("-Wall")
        .arg("-Werror")
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {cc:?}: {e}"));
    assert!(
        out.status.success(),
        "compiling against the uapi headers failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&bin).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    text.lines()
        .map(|l| {
            let (k, v) = l.rsplit_once('=').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}

#[test]
fn every_layout_fact_matches_the_uapi_headers() {
    let c = run_c_program();
    let facts = abi_facts();
    assert_eq!(c.len(), facts.len(), "one C line per fact");
    let mut mismatches = Vec::new();
    for fact in &facts {
        match c.get(fact.name) {
            Some(&v) if v == fact.value => {}
            Some(&v) => mismatches.push(format!("{}: rust {} C {}", fact.name, fact.value, v)),
            None => mismatches.push(format!("{}: missing from the C output", fact.name)),
        }
    }
    assert!(
        mismatches.is_empty(),
        "ABI mismatches:\n{}",
        mismatches.join("\n")
    );
}

#[test]
fn the_facts_cover_every_ioctl_the_platform_issues() {
    let names: Vec<&str> = abi_facts().iter().map(|f| f.name).collect();
    for ioctl in [
        "IOCTL_GNTALLOC_ALLOC_GREF",
        "IOCTL_GNTALLOC_DEALLOC_GREF",
        "IOCTL_GNTALLOC_SET_UNMAP_NOTIFY",
        "IOCTL_GNTDEV_MAP_GRANT_REF",
        "IOCTL_GNTDEV_UNMAP_GRANT_REF",
        "IOCTL_GNTDEV_GET_OFFSET_FOR_VADDR",
        "IOCTL_GNTDEV_SET_MAX_GRANTS",
        "IOCTL_GNTDEV_SET_UNMAP_NOTIFY",
        "IOCTL_GNTDEV_GRANT_COPY",
        "IOCTL_EVTCHN_BIND_INTERDOMAIN",
        "IOCTL_EVTCHN_BIND_UNBOUND_PORT",
        "IOCTL_EVTCHN_UNBIND",
        "IOCTL_EVTCHN_NOTIFY",
        "IOCTL_EVTCHN_RESET",
        "IOCTL_EVTCHN_RESTRICT_DOMID",
    ] {
        assert!(names.contains(&ioctl), "{ioctl} is not checked");
    }
}

#[test]
fn c_expressions_are_derived_from_fact_names() {
    assert_eq!(c_expression("sizeof(struct a)"), "sizeof(struct a)");
    assert_eq!(c_expression("alignof(struct a)"), "_Alignof(struct a)");
    assert_eq!(
        c_expression("offsetof(struct a,b.c)"),
        "offsetof(struct a, b.c)"
    );
    assert_eq!(c_expression("IOCTL_X"), "IOCTL_X");
}
