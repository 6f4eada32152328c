"""Checks template.yaml beyond what cfn-lint checks.

- IAM least privilege: no wildcard in any action; no "*" resource except for actions that
  support no resource-level permissions (EC2 Describe calls).
- Alarms reach someone: every topic an alarm publishes to is unencrypted or encrypted with a
  customer-managed key whose policy lets CloudWatch use it (CloudWatch cannot use the
  AWS-managed SNS key).
- Failed batches are kept whole: an event source mapping's on-failure destination, if any, is an
  S3 bucket (SQS and SNS destinations receive metadata only).
- Ingest writes only where it must: S3 data, pending-list, partition-state and table-metadata
  prefixes (denied the interval joins' state and the dead letters' data), and DynamoDB items
  whose keys begin with checkpoints#, source#, pending# or state#.
- Observability: JSON logs at the LogLevel parameter, X-Ray tracing, EMF metrics and their
  alarms in one namespace scoped to the stack.
- The template and infra/pipeline.toml agree on the tables' topics (STREAMTABLE_TOPICS, the
  topic parameters' defaults, the event source mappings, the IAM topics).
- samconfig.toml: every environment sets the required parameters, with valid values.
- The dashboards have one source of truth: every Athena named query and QuickSight dataset SQL
  equals a file of infra/dashboards, and every dataset declares exactly the query's columns;
  the QuickSight analysis and dashboard are generated from the files' chart headers.

Run: python tests/py/test_template.py (exit status 1 and a list of findings on failure).
"""

import pathlib
import re
import sys

from cfnlint.decode import decode_str

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Actions without resource-level permissions (https://docs.aws.amazon.com/service-authorization/).
STAR_RESOURCE_OK = {
    "ec2:DescribeNetworkInterfaces",
    "ec2:DescribeVpcs",
    "ec2:DescribeSubnets",
    "ec2:DescribeSecurityGroups",
}


def as_list(v):
    return v if isinstance(v, list) else [v]


def statements(template):
    """(where, statement) for every IAM statement of every function policy and IAM resource."""
    for name, res in template.get("Resources", {}).items():
        props = res.get("Properties", {}) or {}
        if res.get("Type") == "AWS::Serverless::Function":
            for i, pol in enumerate(as_list(props.get("Policies", []))):
                if isinstance(pol, dict) and "Statement" in pol:
                    for j, st in enumerate(pol["Statement"]):
                        yield f"{name}.Policies[{i}].Statement[{j}]", st
                elif isinstance(pol, (str, dict)):
                    yield f"{name}.Policies[{i}]", {"Managed": pol}
        if res.get("Type") in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy", "AWS::IAM::Role"):
            docs = []
            if "PolicyDocument" in props:
                docs.append(props["PolicyDocument"])
            for p in props.get("Policies", []) or []:
                docs.append(p.get("PolicyDocument", {}))
            for d in docs:
                for j, st in enumerate(d.get("Statement", [])):
                    yield f"{name}.Statement[{j}]", st


def iam_findings(template):
    out = []
    for where, st in statements(template):
        if "Managed" in st:
            out.append(f"{where}: managed or SAM policy template {st['Managed']!r}: write the statements out")
            continue
        if st.get("Effect") != "Allow":
            continue
        actions = [a for a in as_list(st.get("Action", [])) if isinstance(a, str)]
        if "NotAction" in st or "NotResource" in st:
            out.append(f"{where}: NotAction/NotResource grants more than it names")
        for a in actions:
            if "*" in a:
                out.append(f"{where}: wildcard action {a}")
        for r in as_list(st.get("Resource", [])):
            if r == "*" and not set(actions) <= STAR_RESOURCE_OK:
                out.append(f"{where}: resource '*' for {sorted(set(actions) - STAR_RESOURCE_OK)}")
    return out


def ref_name(v):
    """The logical id a !Ref or !GetAtt names, or None."""
    if isinstance(v, dict):
        if "Ref" in v:
            return v["Ref"]
        if "Fn::GetAtt" in v:
            att = v["Fn::GetAtt"]
            return att[0] if isinstance(att, list) else str(att).split(".")[0]
    return None


def if_branches(v):
    """Both branches of an !If (or the value itself)."""
    if isinstance(v, dict) and "Fn::If" in v:
        return [b for b in v["Fn::If"][1:] if not (isinstance(b, dict) and b.get("Ref") == "AWS::NoValue")]
    return [v]


def alarm_findings(template):
    out = []
    res = template.get("Resources", {})
    topics = set()
    for name, r in res.items():
        if r.get("Type") == "AWS::CloudWatch::Alarm":
            for action in as_list((r.get("Properties") or {}).get("AlarmActions", [])):
                if ref_name(action):
                    topics.add(ref_name(action))
    if not topics:
        out.append("no alarm publishes to a topic")
    for t in sorted(topics):
        props = res.get(t, {}).get("Properties") or {}
        key = props.get("KmsMasterKeyId")
        if key is None:
            continue
        if isinstance(key, str):
            out.append(f"{t}: encrypted with {key!r}; CloudWatch alarms cannot use an AWS-managed key")
            continue
        key_res = res.get(ref_name(key) or "", {})
        if key_res.get("Type") != "AWS::KMS::Key":
            out.append(f"{t}: KmsMasterKeyId is not a key of this template")
            continue
        ok = False
        for st in key_res["Properties"]["KeyPolicy"]["Statement"]:
            services = as_list((st.get("Principal") or {}).get("Service", []))
            actions = set(as_list(st.get("Action", [])))
            if (st.get("Effect") == "Allow" and "cloudwatch.amazonaws.com" in services
                    and "kms:Decrypt" in actions
                    and any(a.startswith("kms:GenerateDataKey") for a in actions)):
                ok = True
        if not ok:
            out.append(f"{t}: the policy of its key does not let cloudwatch.amazonaws.com use it")
    return out


def esm_findings(template):
    out = []
    res = template.get("Resources", {})
    for name, r in res.items():
        if r.get("Type") != "AWS::Serverless::Function":
            continue
        for ev_name, ev in ((r.get("Properties") or {}).get("Events") or {}).items():
            if ev.get("Type") != "MSK":
                continue
            for config in if_branches(ev["Properties"].get("DestinationConfig")):
                if not config:
                    continue
                dest = config.get("OnFailure", {}).get("Destination")
                target = res.get(ref_name(dest) or "", {}).get("Type")
                if target != "AWS::S3::Bucket":
                    out.append(f"{name}.{ev_name}: on-failure destination {target} keeps no records; use an S3 bucket")
    return out


def ingest_scope_findings(template):
    out = []
    fn = template["Resources"]["IngestFunction"]
    for pol in as_list(fn["Properties"].get("Policies", [])):
        for st in pol.get("Statement", []):
            for st in if_branches(st):
                actions = as_list(st.get("Action", []))
                if any(a.startswith("dynamodb:") for a in actions):
                    cond = st.get("Condition") or {}
                    like = cond.get("ForAllValues:StringLike", {}).get("dynamodb:LeadingKeys")
                    equal = cond.get("ForAllValues:StringEquals", {}).get("dynamodb:LeadingKeys")
                    if sorted(like or []) == ["checkpoints#*", "pending#*", "source#*", "state#*"]:
                        pass
                    elif equal == ["meta"] and actions == ["dynamodb:GetItem"]:
                        pass
                    else:
                        out.append(
                            f"IngestFunction {st.get('Sid')}: DynamoDB access not limited to checkpoint, state and "
                            "pending keys (and reading the layout item)"
                        )
                if "s3:PutObject" in actions and st.get("Effect") == "Allow":
                    for r in as_list(st.get("Resource", [])):
                        text = r.get("Fn::Sub", "") if isinstance(r, dict) else str(r)
                        text = text[0] if isinstance(text, list) else text
                        if not text.endswith(INGEST_WRITES):
                            out.append(
                                f"IngestFunction {st.get('Sid')}: writes {text}, beyond data files, "
                                "pending lists, partition states and table metadata"
                            )
    denied = set()
    for pol in as_list(fn["Properties"].get("Policies", [])):
        for st in pol.get("Statement", []):
            if st.get("Effect") == "Deny":
                for r in as_list(st.get("Resource", [])):
                    text = r.get("Fn::Sub", "") if isinstance(r, dict) else str(r)
                    denied.add(text[0] if isinstance(text, list) else text)
    for suffix in INGEST_DENIED:
        if not any(d.endswith(suffix) for d in denied):
            out.append(f"IngestFunction: no Deny on ...{suffix}")
    return out


# Where ingest may write, and what it is denied although a wider grant covers it.
INGEST_WRITES = (
    ".db/*/data/*",
    "/warehouse/_pending/*",
    "/warehouse/_state/partitions/*",
    ".db/*/metadata/*",
    # The event source mapping writes failed batches with the function's role.
    "${FailedBatchBucket.Arn}/*",
)
INGEST_DENIED = ("/warehouse/_state/join/*", ".db/dead_letters/data/*")


def sql_body(text):
    """The SQL without header comment lines, whitespace normalised."""
    lines = [l for l in text.splitlines() if not l.strip().startswith("--")]
    return " ".join(" ".join(lines).split())


def select_columns(sql):
    """Output column names of a simple SELECT list (alias or bare column)."""
    m = re.search(r"select\s+(.*?)\s+from\s", sql, re.S | re.I)
    items, depth, cur = [], 0, ""
    for ch in m.group(1):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    return [re.split(r"\s+as\s+", i.strip(), flags=re.I)[-1].strip() for i in items]


def dashboard_findings(template):
    out = []
    files = {p.stem: sql_body(p.read_text()) for p in sorted((ROOT / "infra/dashboards").glob("*.sql"))}
    sqls = set(files.values())
    named, datasets = 0, 0
    for name, res in template.get("Resources", {}).items():
        props = res.get("Properties", {}) or {}
        if res.get("Type") == "AWS::Athena::NamedQuery":
            named += 1
            if sql_body(props["QueryString"]) not in sqls:
                out.append(f"{name}: its SQL is not one of infra/dashboards/*.sql")
        if res.get("Type") == "AWS::QuickSight::DataSet":
            datasets += 1
            for table in props["PhysicalTableMap"].values():
                custom = table["CustomSql"]
                body = sql_body(custom["SqlQuery"])
                if body not in sqls:
                    out.append(f"{name}: its SQL is not one of infra/dashboards/*.sql")
                    continue
                declared = [c["Name"] for c in custom["Columns"]]
                if declared != select_columns(body):
                    out.append(f"{name}: columns {declared} but the query returns {select_columns(body)}")
    if named != len(files):
        out.append(f"{named} Athena named queries for {len(files)} dashboard files")
    if datasets != len(files):
        out.append(f"{datasets} QuickSight datasets for {len(files)} dashboard files")
    return out


def observability_findings(template):
    """Logs, traces and metrics as Lambda users expect: JSON logs with a level parameter, X-Ray
    tracing on every function, and every alarm on our metrics reading the namespace the
    functions write them to (scoped to the stack)."""
    out = []
    globals_fn = template.get("Globals", {}).get("Function", {})
    env = globals_fn.get("Environment", {}).get("Variables", {})
    namespace = env.get("STREAMTABLE_METRICS_NAMESPACE")
    if namespace != {"Fn::Sub": "streamtable/${AWS::StackName}"}:
        out.append(f"STREAMTABLE_METRICS_NAMESPACE is {namespace!r}, not scoped to the stack")
    if "RUST_LOG" in env:
        out.append("RUST_LOG in Globals overrides the LogLevel parameter")
    if globals_fn.get("Tracing") != "Active":
        out.append("functions are not traced by X-Ray (Globals.Function.Tracing: Active)")
    for name, r in template["Resources"].items():
        props = r.get("Properties", {})
        if r["Type"] == "AWS::Serverless::Function":
            logging = props.get("LoggingConfig", {})
            if logging.get("LogFormat") != "JSON" or logging.get("ApplicationLogLevel") != {"Ref": "LogLevel"}:
                out.append(f"{name}: LoggingConfig is not JSON with ApplicationLogLevel: !Ref LogLevel")
        if r["Type"] == "AWS::Serverless::Function":
            for ev_name, ev in props.get("Events", {}).items():
                if ev.get("Type") == "MSK":
                    metrics = ev["Properties"].get("MetricsConfig", {}).get("Metrics", [])
                    if "KafkaMetrics" not in metrics:
                        out.append(f"{name}.{ev_name}: the mapping does not report its Kafka metrics (offset lag)")
        if r["Type"] == "AWS::CloudWatch::Alarm" and props.get("Namespace") not in (None, "AWS/Lambda", "AWS/Events", "AWS/S3"):
            if props.get("Namespace") != namespace:
                out.append(f"{name}: alarm namespace {props.get('Namespace')!r} is not the functions' {namespace!r}")
    lag = [
        r["Properties"]
        for r in template["Resources"].values()
        if r["Type"] == "AWS::CloudWatch::Alarm"
        and r["Properties"].get("Namespace") == "AWS/Lambda"
        and r["Properties"].get("MetricName") == "OffsetLag"
    ]
    if not lag or any(p.get("TreatMissingData") != "breaching" for p in lag):
        out.append("no alarm on the mappings' OffsetLag that a stalled mapping (no data) trips")
    return out


def spec_findings(template):
    """The template and infra/pipeline.toml agree: STREAMTABLE_TOPICS names every [[tables]]
    entry with a topic parameter whose default is the spec's topic, and that parameter is read
    by an event source mapping of the ingest function and allowed by its IAM policy."""
    import tomllib

    out = []
    spec = tomllib.loads((ROOT / "infra/pipeline.toml").read_text())
    want = {t["name"]: t["topic"] for t in spec.get("tables", [])}
    env = template["Globals"]["Function"]["Environment"]["Variables"]
    sub = env.get("STREAMTABLE_TOPICS", {}).get("Fn::Sub", "")
    params = template.get("Parameters", {})
    mapping = {}
    for pair in filter(None, sub.split(",")):
        table, _, topic = pair.partition("=")
        m = re.fullmatch(r"\$\{(\w+)\}", topic)
        if not m:
            out.append(f"STREAMTABLE_TOPICS: {pair!r} is not table=${{TopicParameter}}")
            continue
        mapping[table] = m.group(1)
    if set(mapping) != set(want):
        out.append(f"STREAMTABLE_TOPICS maps tables {sorted(mapping)}, the spec has {sorted(want)}")
    ingest = template["Resources"]["IngestFunction"]["Properties"]
    esm_params = {
        ref_name(topic)
        for e in ingest.get("Events", {}).values()
        if e.get("Type") == "MSK"
        for topic in e["Properties"].get("Topics", [])
    }
    policy_text = repr(ingest.get("Policies"))
    for table, param in mapping.items():
        default = params.get(param, {}).get("Default")
        if table in want and default != want[table]:
            out.append(f"{param} defaults to {default!r}; infra/pipeline.toml's {table} reads {want[table]!r}")
        if param not in esm_params:
            out.append(f"no event source mapping of IngestFunction reads {param} (table {table})")
        if "${" + param + "}" not in policy_text:
            out.append(f"IngestFunction's IAM policy does not allow reading topic {param}")
    return out


def quicksight_findings(template):
    """The QuickSight analysis and dashboard are what scripts/quicksight.py makes of
    infra/dashboards: one visual per chart header, on the chart's dataset."""
    import subprocess

    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts/quicksight.py"), "--check"],
        capture_output=True,
        text=True,
    )
    if run.returncode != 0:
        return [(run.stdout + run.stderr).strip()]
    kinds = {r["Type"] for r in template["Resources"].values()}
    return [
        f"template.yaml has no {t}"
        for t in ("AWS::QuickSight::Analysis", "AWS::QuickSight::Dashboard")
        if t not in kinds
    ]


def retention_findings(template):
    """What outlives the stack does: the data bucket, the state table and the Glue database are
    retained on delete and on replacement, and a new stack can adopt them instead of creating
    its own; Athena queries are bounded in bytes scanned."""
    out = []
    resources = template["Resources"]
    for name in ("DataBucket", "StateTable", "GlueDatabase"):
        r = resources.get(name, {})
        for policy in ("DeletionPolicy", "UpdateReplacePolicy"):
            if r.get(policy) != "Retain":
                out.append(f"{name}: {policy} is {r.get(policy)!r}, not Retain")
    for name, cond in (("DataBucket", "CreatesDataBucket"), ("StateTable", "CreatesStateTable")):
        if resources.get(name, {}).get("Condition") != cond:
            out.append(f"{name} is created even when a deleted stack's is adopted (Condition: {cond})")
    wg = resources.get("AthenaWorkGroup", {}).get("Properties", {}).get("WorkGroupConfiguration", {})
    if "BytesScannedCutoffPerQuery" not in wg:
        out.append("AthenaWorkGroup has no BytesScannedCutoffPerQuery")
    return out


def samconfig_findings(template):
    """samconfig.toml: each environment deploys with the capabilities the template needs and
    parameters the template has, every required parameter set."""
    import tomllib

    out = []
    config = tomllib.loads((ROOT / "samconfig.toml").read_text())
    params = template.get("Parameters", {})
    required = {n for n, p in params.items() if "Default" not in p}
    envs = [e for e in config if isinstance(config[e], dict)]
    if "default" not in envs or len(envs) < 2:
        out.append(f"samconfig.toml has environments {envs}; want default and at least one more")
    stacks = set()
    for e in envs:
        deploy = config[e].get("deploy", {}).get("parameters", {})
        stack = config[e].get("global", {}).get("parameters", {}).get("stack_name")
        if not stack or stack in stacks:
            out.append(f"samconfig.toml [{e}]: stack_name {stack!r} missing or shared")
        stacks.add(stack)
        if "CAPABILITY_IAM" not in deploy.get("capabilities", ""):
            out.append(f"samconfig.toml [{e}]: deploy needs CAPABILITY_IAM (the functions' roles)")
        overrides = deploy.get("parameter_overrides", [])
        given = {o.split("=", 1)[0] for o in as_list(overrides)}
        for unknown in sorted(given - set(params)):
            out.append(f"samconfig.toml [{e}]: parameter {unknown} is not in template.yaml")
        for missing in sorted(required - given):
            out.append(f"samconfig.toml [{e}]: required parameter {missing} is not set")
        for o in as_list(overrides):
            name, value = o.split("=", 1)
            allowed = params.get(name, {}).get("AllowedValues")
            pattern = params.get(name, {}).get("AllowedPattern")
            if allowed and value not in [str(a) for a in allowed]:
                out.append(f"samconfig.toml [{e}]: {name}={value} is not one of {allowed}")
            if pattern and not re.fullmatch(pattern, value):
                out.append(f"samconfig.toml [{e}]: {name}={value} does not match {pattern}")
    return out


def main():
    template, matches = decode_str((ROOT / "template.yaml").read_text())
    if matches:
        print("template.yaml does not parse:", matches)
        return 1
    findings = (
        iam_findings(template)
        + alarm_findings(template)
        + esm_findings(template)
        + ingest_scope_findings(template)
        + dashboard_findings(template)
        + observability_findings(template)
        + samconfig_findings(template)
        + spec_findings(template)
        + retention_findings(template)
        + quicksight_findings(template)
    )
    for f in findings:
        print("FAIL", f)
    if not findings:
        print(
            "template.yaml: IAM statements name their resources; alarms can publish; failed batches "
            "go to S3; ingest is scoped; dashboards match infra/dashboards; logs, traces and "
            "metrics are scoped to the stack; samconfig.toml deploys every environment"
        )
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
