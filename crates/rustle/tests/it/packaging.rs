//! What rustle is installed with: the manual page and shell completions made from the
//! command line's definition, the systemd unit, the container image's Dockerfile and the
//! Kubernetes example, each read by the tool that reads it where that is installed
//! (man, bash, systemd-analyze, hadolint, python3's yaml).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::util::*;

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rustle(args: &[&str]) -> Output {
    Command::new(rustle_bin()).args(args).env("RUSTLE_CONFIG", "").output().expect("run rustle")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const SUBCOMMANDS: [&str; 7] = ["check", "reload", "passwd", "user", "cert", "man", "completions"];

#[test]
fn the_manual_page_names_every_subcommand_and_renders() {
    let out = rustle(&["man"]);
    assert_success("rustle man", &out);
    let roff = stdout(&out);
    assert!(roff.contains(".TH RUSTLE 1"), "{roff}");
    for section in ["NAME", "SYNOPSIS", "OPTIONS", "SUBCOMMANDS", "FILES", "ENVIRONMENT", "SIGNALS"]
    {
        assert!(roff.contains(&format!("\n.SH {section}\n")), "no {section}:\n{roff}");
    }
    for sub in SUBCOMMANDS {
        assert!(roff.contains(&format!("rustle\\-{sub}(1)")), "{sub} is not named:\n{roff}");
    }
    for flag in ["config", "http", "socks", "relay", "users", "workers"] {
        assert!(roff.contains(&format!("\\-\\-{flag}")), "--{flag} is not named:\n{roff}");
    }
    assert!(roff.contains("/etc/rustle/rustle.toml") && roff.contains("RUSTLE_CONFIG"));
    if have_for_part("man") {
        let text = render(&roff);
        for shown in ["SYNOPSIS", "rustle-check(1)", "--config", "/etc/rustle/rustle.toml"] {
            assert!(text.contains(shown), "`{shown}` is not shown:\n{text}");
        }
    }

    // A page per subcommand, for `man rustle-check`, in a directory made for them.
    let top = TempDir::new("man");
    let dir = top.path().join("share/man1");
    let out = rustle(&["man", "--dir", dir.to_str().unwrap()]);
    assert_success("rustle man --dir", &out);
    let written = stdout(&out);
    assert_eq!(written.lines().count(), 1 + SUBCOMMANDS.len(), "{written}");
    assert_eq!(std::fs::read_to_string(dir.join("rustle.1")).unwrap(), roff);
    for sub in SUBCOMMANDS {
        let page = std::fs::read_to_string(dir.join(format!("rustle-{sub}.1"))).unwrap();
        assert!(page.contains(&format!(".TH RUSTLE-{} 1", sub.to_uppercase())), "{page}");
    }
    let check = std::fs::read_to_string(dir.join("rustle-check.1")).unwrap();
    assert!(check.contains("\\-\\-config"), "{check}");
    if have_for_part("man") {
        assert!(render(&check).contains("--config"));
    }
    // A directory that cannot be made: the error names it.
    let file = top.file("a-file");
    std::fs::write(&file, "").unwrap();
    let out = rustle(&["man", "--dir", file.join("sub").to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let want =
        format!("cannot create the directory {}: Not a directory", file.join("sub").display());
    assert!(err.contains(&want), "{err}");
}

/// `man -l -` of a page: the text, after checking that man and groff had nothing to say.
fn render(roff: &str) -> String {
    let mut child = Command::new("man")
        .args(["-l", "-"])
        .env("MANWIDTH", "100")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run man");
    child.stdin.take().unwrap().write_all(roff.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_success("man -l -", &out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.trim().is_empty(), "man -l - said: {err}");
    stdout(&out)
}

#[test]
fn the_bash_completion_completes_subcommands_and_options() {
    if !have("bash") {
        return;
    }
    let out = rustle(&["completions", "bash"]);
    assert_success("rustle completions bash", &out);
    let dir = TempDir::new("completions");
    let script = dir.file("rustle.bash");
    std::fs::write(&script, &out.stdout).unwrap();
    // Sources the script, then asks the function `complete -p rustle` names for the words
    // that complete LINE (the cursor at its end).
    let complete = |line: &str| -> Vec<String> {
        let probe = r#"source "$1" || exit 3
            f=$(complete -p rustle | sed -n 's/.* -F \([^ ]*\) .*/\1/p')
            [ -n "$f" ] || exit 4
            COMP_LINE="$2"; COMP_POINT=${#COMP_LINE}
            read -ra COMP_WORDS <<< "$2"
            [[ "$2" == *" " ]] && COMP_WORDS+=("")
            COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
            "$f" rustle "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
            printf '%s\n' "${COMPREPLY[@]}""#;
        let out = Command::new("bash")
            .args(["--norc", "-c", probe, "bash", script.to_str().unwrap(), line])
            .output()
            .unwrap();
        assert_success(&format!("completing `{line}`"), &out);
        stdout(&out).lines().map(String::from).filter(|l| !l.is_empty()).collect()
    };
    assert_eq!(complete("rustle ch"), ["check"]);
    let all = complete("rustle ");
    for sub in SUBCOMMANDS {
        assert!(all.iter().any(|w| w == sub), "{sub} not offered: {all:?}");
    }
    assert!(complete("rustle check --con").contains(&"--config".to_string()));
    let shells = complete("rustle completions ");
    for shell in ["bash", "zsh", "fish"] {
        assert!(shells.iter().any(|w| w == shell), "{shell} not offered: {shells:?}");
    }
    // The other shells' scripts, where those shells are installed, at least parse.
    for (shell, check) in [("zsh", "-n"), ("fish", "--no-execute")] {
        let out = rustle(&["completions", shell]);
        assert_success(&format!("rustle completions {shell}"), &out);
        assert!(stdout(&out).contains("rustle"));
        if Command::new(shell).arg("--version").output().is_ok() {
            let file = dir.file(&format!("rustle.{shell}"));
            std::fs::write(&file, &out.stdout).unwrap();
            let status = Command::new(shell).arg(check).arg(&file).status().unwrap();
            assert!(status.success(), "{shell} {check} of its completion script: {status}");
        }
    }
}

#[test]
fn the_systemd_unit_verifies_and_has_what_a_service_needs() {
    let unit = std::fs::read_to_string(root().join("contrib/rustle.service")).unwrap();
    for line in [
        "Type=notify",
        "ExecStartPre=/usr/local/bin/rustle check --no-bind --config /etc/rustle/rustle.toml",
        "ExecReload=/usr/local/bin/rustle reload --config /etc/rustle/rustle.toml",
        "LimitNOFILE=",
        "AmbientCapabilities=CAP_NET_BIND_SERVICE",
        "User=rustle",
        "NoNewPrivileges=true",
        "ProtectSystem=strict",
        "UMask=0027",
    ] {
        assert!(unit.lines().any(|l| l.starts_with(line)), "no `{line}` in the unit");
    }
    if !have("systemd-analyze") {
        return;
    }
    // The unit as installed, with the binary where these tests built it.
    let dir = TempDir::new("unit");
    let file = dir.file("rustle.service");
    std::fs::write(&file, unit.replace("/usr/local/bin/rustle", rustle_bin())).unwrap();
    let out = Command::new("systemd-analyze").arg("verify").arg(&file).output().unwrap();
    assert_success("systemd-analyze verify", &out);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!said.contains("rustle.service"), "systemd-analyze verify: {said}");
}

/// The container's configuration (the image's /etc/rustle/rustle.toml and the ConfigMap's):
/// (listener ports, admin port).
fn container_ports() -> (Vec<u16>, u16) {
    let text = std::fs::read_to_string(root().join("contrib/docker/rustle.toml")).unwrap();
    let table: toml::Table = text.parse().unwrap();
    let port = |v: &toml::Value| {
        let addr: std::net::SocketAddr = v["listen"].as_str().unwrap().parse().unwrap();
        addr.port()
    };
    let listeners = table["listener"].as_array().unwrap().iter().map(port).collect();
    (listeners, port(&table["admin"]))
}

#[test]
fn the_container_configuration_passes_check() {
    let file = root().join("contrib/docker/rustle.toml");
    // (--no-bind: the container's ports may be in use on the machine that builds it.)
    let out = rustle(&["check", "--no-bind", "--config", file.to_str().unwrap()]);
    assert_success("rustle check contrib/docker/rustle.toml", &out);
}

/// The Dockerfile's instructions: (keyword, arguments), continuation lines joined.
fn instructions(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => current.push_str(&format!("{} ", part.trim())),
            None => {
                current.push_str(line);
                let (keyword, args) = current.split_once(' ').unwrap_or((&current, ""));
                out.push((keyword.to_uppercase(), args.trim().to_string()));
                current.clear();
            }
        }
    }
    out
}

#[test]
fn the_dockerfile_builds_rustle_and_runs_it_unprivileged_on_the_default_file() {
    let text = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    let all = instructions(&text);
    let stages: Vec<usize> =
        all.iter().enumerate().filter(|(_, (k, _))| k == "FROM").map(|(i, _)| i).collect();
    assert_eq!(stages.len(), 2, "a build stage and a runtime stage");
    let (build, run) = (&all[stages[0]..stages[1]], &all[stages[1]..]);
    assert!(build[0].1.ends_with(" AS build"), "{:?}", build[0]);
    assert!(build.iter().any(|(k, a)| k == "RUN"
        && a.contains("cargo build --release --locked -p rustle")
        && a.contains("check --no-bind --config contrib/docker/rustle.toml")));
    let get = |key: &str| -> Vec<&str> {
        run.iter().filter(|(k, _)| k == key).map(|(_, a)| a.as_str()).collect()
    };
    // Not root, by number (Kubernetes' runAsNonRoot checks the number).
    let user = get("USER");
    let uid: u32 = user.last().unwrap().split(':').next().unwrap().parse().unwrap();
    assert!(uid != 0, "{user:?}");
    assert!(get("COPY").contains(&"contrib/docker/rustle.toml /etc/rustle/rustle.toml"));
    assert!(get("COPY").iter().any(|a| a.starts_with("--from=build ")));
    assert_eq!(get("ENTRYPOINT"), ["[\"/usr/local/bin/rustle\"]"]);
    // The ports the configuration listens on, the admin port among them.
    let exposed: Vec<u16> = get("EXPOSE")
        .iter()
        .flat_map(|a| a.split_whitespace())
        .map(|p| p.parse().unwrap())
        .collect();
    let (listeners, admin) = container_ports();
    for port in listeners.iter().chain([&admin]) {
        assert!(exposed.contains(port), "port {port} is not exposed: {exposed:?}");
    }
    // Every file the build copies from the context is there and not ignored.
    let ignore = std::fs::read_to_string(root().join(".dockerignore")).unwrap();
    assert!(ignore.lines().any(|l| l == "target/"), "{ignore}");
    assert!(root().join("contrib/docker/rustle.toml").is_file());
    if rustle_bench::tools::optional("hadolint") {
        let out = Command::new("hadolint").arg(root().join("Dockerfile")).output().unwrap();
        assert_success("hadolint Dockerfile", &out);
    }
}

#[test]
fn the_kubernetes_example_probes_the_admin_port_and_mounts_the_configuration() {
    let yaml = Command::new("python3").args(["-c", "import yaml"]).status();
    if !yaml.is_ok_and(|s| s.success()) {
        rustle_bench::tools::missing("python3-yaml");
        return;
    }
    let dir = root().join("contrib/kubernetes");
    let files = ["configmap.yaml", "deployment.yaml", "service.yaml"];
    let script = "import json, sys, yaml\n\
                  docs = [d for f in sys.argv[1:] for d in yaml.safe_load_all(open(f))]\n\
                  print(json.dumps(docs))";
    let out = Command::new("python3")
        .args(["-c", script])
        .args(files.iter().map(|f| dir.join(f)))
        .output()
        .unwrap();
    assert_success("python3 yaml", &out);
    let docs: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let of =
        |kind: &str| docs.iter().find(|d| d["kind"] == kind).unwrap_or_else(|| panic!("{kind}"));
    let (config_map, deployment, service) = (of("ConfigMap"), of("Deployment"), of("Service"));

    // The ConfigMap carries the container's file, which rustle accepts, and a drain delay.
    let image_file = std::fs::read_to_string(root().join("contrib/docker/rustle.toml")).unwrap();
    let file = config_map["data"]["rustle.toml"].as_str().unwrap();
    let kubernetes_only = file.strip_prefix(image_file.as_str()).expect("the image's file first");
    assert!(kubernetes_only.contains("[timeouts]"), "{kubernetes_only}");
    let timeouts = rustle::config::Config::parse(file).expect("the ConfigMap's file").timeouts;
    assert!(!timeouts.drain_delay.is_zero(), "{kubernetes_only}");

    let pod = &deployment["spec"]["template"];
    let labels = &pod["metadata"]["labels"];
    assert_eq!(&deployment["spec"]["selector"]["matchLabels"], labels);
    let spec = &pod["spec"];
    assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
    let c = &spec["containers"][0];
    // SIGTERM: accepting for the drain delay, then draining; the grace period covers both
    // (and rustle waits itself: no preStop hook, which the image could not run).
    let grace = spec["terminationGracePeriodSeconds"].as_u64().unwrap();
    let needed = (timeouts.drain_delay + timeouts.shutdown).as_secs();
    assert!(grace > needed, "terminationGracePeriodSeconds {grace}, drain needs {needed}");
    assert!(c["lifecycle"]["preStop"].is_null());
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    for key in ["requests", "limits"] {
        assert!(
            c["resources"][key]["cpu"].is_string() && c["resources"][key]["memory"].is_string()
        );
    }
    let port_of = |name: &str| {
        let ports = c["ports"].as_array().unwrap();
        let p = ports.iter().find(|p| p["name"] == name).unwrap_or_else(|| panic!("{name}"));
        p["containerPort"].as_u64().unwrap() as u16
    };
    let (listeners, admin) = container_ports();
    assert_eq!(port_of("admin"), admin);
    assert_eq!(listeners, [port_of("proxy"), port_of("socks")]);
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        assert_eq!(c[probe]["httpGet"]["path"], path, "{probe}");
        assert_eq!(c[probe]["httpGet"]["port"], "admin", "{probe}");
    }
    // The ConfigMap mounted where rustle reads its file by default.
    let mount = &c["volumeMounts"][0];
    assert_eq!(mount["mountPath"], "/etc/rustle");
    let volume = spec["volumes"].as_array().unwrap().iter().find(|v| v["name"] == mount["name"]);
    assert_eq!(volume.unwrap()["configMap"]["name"], config_map["metadata"]["name"]);
    assert!(c["args"].is_null() && c["command"].is_null(), "rustle reads the default file");

    // The Service reaches the pods' proxy ports by name.
    assert_eq!(&service["spec"]["selector"], labels);
    for p in service["spec"]["ports"].as_array().unwrap() {
        port_of(p["targetPort"].as_str().unwrap());
    }
}
