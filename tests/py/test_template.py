"""Checks template.yaml beyond what cfn-lint checks.

- IAM least privilege: no wildcard in any action; no "*" resource except for actions that
  support no resource-level permissions (EC2 Describe calls).
- Alarms reach someone: every topic an alarm publishes to is unencrypted or encrypted with a
  customer-managed key whose policy lets CloudWatch use it (CloudWatch cannot use the
  AWS-managed SNS key).
- Failed batches are kept whole: an event source mapping's on-failure destination, if any, is an
  S3 bucket (SQS and SNS destinations receive metadata only).
- The Kafka source (KafkaSource): the template rendered for MSK and for a self-managed cluster
  (every authentication, with and without a VPC) has exactly one family of mappings, one per
  topic, sharing every setting; each authentication gives the right SourceAccessConfigurations;
  the ingest role may read the secrets named there (and only then), holds MSK permissions only
  for MSK; the Rules refuse incomplete choices; README's self-managed `sam deploy` examples pass
  them. The SAM transform (which cfn-lint and `sam validate --lint` do not run) accepts the
  template.
- Ingest writes only where it must: S3 data, pending-list, partition-state and table-metadata
  prefixes (denied the interval joins' state and the dead letters' data), and DynamoDB items
  whose keys begin with checkpoints#, source#, pending# or state#.
- Observability: JSON logs at the LogLevel parameter, X-Ray tracing, EMF metrics and their
  alarms in one namespace scoped to the stack.
- The template and infra/pipeline.toml agree on the tables' topics (STREAMTABLE_TOPICS, the
  topic parameters' defaults, the event source mappings, the IAM topics).
- samconfig.toml: every environment sets the required parameters, with valid values, and
  passes the template's Rules.
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
    """(where, statement) for every IAM statement of every function policy and IAM resource
    (both branches of a conditional one)."""
    for name, res in template.get("Resources", {}).items():
        props = res.get("Properties", {}) or {}
        if res.get("Type") == "AWS::Serverless::Function":
            for i, pol in enumerate(as_list(props.get("Policies", []))):
                if isinstance(pol, dict) and "Statement" in pol:
                    for j, st in enumerate(pol["Statement"]):
                        for st in if_branches(st):
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


KAFKA_EVENT_TYPES = ("MSK", "SelfManagedKafka")


def kafka_mappings(template, function="IngestFunction"):
    """(logical id, properties) of the Kafka event source mappings invoking `function`: plain
    AWS::Lambda::EventSourceMapping resources (MSK: AmazonManagedKafkaEventSourceConfig;
    self-managed: SelfManagedEventSource)."""
    out = []
    for name, r in template.get("Resources", {}).items():
        props = r.get("Properties") or {}
        if r.get("Type") != "AWS::Lambda::EventSourceMapping" or ref_name(props.get("FunctionName")) != function:
            continue
        if "AmazonManagedKafkaEventSourceConfig" in props or "SelfManagedEventSource" in props:
            out.append((name, props))
    return out


def esm_findings(template):
    out = []
    res = template.get("Resources", {})
    mappings = [
        (name, r["Properties"])
        for name, r in res.items()
        if r.get("Type") == "AWS::Lambda::EventSourceMapping" and "Topics" in (r.get("Properties") or {})
    ]
    for name, r in res.items():
        if r.get("Type") != "AWS::Serverless::Function":
            continue
        for ev_name, ev in ((r.get("Properties") or {}).get("Events") or {}).items():
            if ev.get("Type") in KAFKA_EVENT_TYPES:
                # SAM events take no Condition (the source is a parameter), and SAM's transform
                # rejects an intrinsic DestinationConfig ("should be a map").
                out.append(
                    f"{name}.{ev_name}: a SAM {ev.get('Type')} event; declare Kafka mappings as "
                    "AWS::Lambda::EventSourceMapping resources with a Condition"
                )
    for name, props in mappings:
        for config in if_branches(props.get("DestinationConfig")):
            if not config:
                continue
            dest = config.get("OnFailure", {}).get("Destination")
            target = res.get(ref_name(dest) or "", {}).get("Type")
            if target != "AWS::S3::Bucket":
                out.append(f"{name}: on-failure destination {target} keeps no records; use an S3 bucket")
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
        if r["Type"] == "AWS::Lambda::EventSourceMapping" and "Topics" in props:
            metrics = props.get("MetricsConfig", {}).get("Metrics", [])
            if "KafkaMetrics" not in metrics:
                out.append(f"{name}: the mapping does not report its Kafka metrics (offset lag)")
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
    by an event source mapping of the ingest function from each Kafka source, and allowed by
    its IAM policy (MSK's topic permissions; a self-managed cluster's ACLs are its own)."""
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
    esm_params = {"MSK": set(), "self-managed": set()}
    for _, props in kafka_mappings(template):
        source = "self-managed" if "SelfManagedEventSource" in props else "MSK"
        esm_params[source] |= {ref_name(topic) for topic in props.get("Topics", [])}
    policy_text = repr(ingest.get("Policies"))
    for table, param in mapping.items():
        default = params.get(param, {}).get("Default")
        if table in want and default != want[table]:
            out.append(f"{param} defaults to {default!r}; infra/pipeline.toml's {table} reads {want[table]!r}")
        for source, read in esm_params.items():
            if param not in read:
                out.append(f"no {source} event source mapping of IngestFunction reads {param} (table {table})")
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


# ---------------------------------------------------------------- the Kafka source, rendered

NO_VALUE = object()
PSEUDO = {
    "AWS::Partition": "aws",
    "AWS::Region": "us-east-1",
    "AWS::AccountId": "111122223333",
    "AWS::StackName": "st-test",
    "AWS::URLSuffix": "amazonaws.com",
}


class Render:
    """The template as CloudFormation deploys it with `overrides` (every other parameter at its
    default): parameter constraints, Rules, Conditions, and the intrinsic functions the template
    uses. Resources render as "<Name>", attributes as "<Name.Attribute>". With strict=True the
    branch an Fn::If does not take is evaluated too (and thrown away), so that a function that
    would fail on it (Fn::Select past the end of a list) fails here."""

    def __init__(self, template, overrides, strict=True):
        self.template = template
        self.strict = strict
        self.params = {}
        for name, p in template.get("Parameters", {}).items():
            v = overrides.get(name, p.get("Default"))
            self.params[name] = None if v is None else str(v)
        self.unknown = sorted(set(overrides) - set(self.params))
        self.conditions = {}

    def parameter_findings(self):
        out = [f"parameter {n} is not in template.yaml" for n in self.unknown]
        for name, p in self.template.get("Parameters", {}).items():
            v = self.params[name]
            if v is None:
                out.append(f"required parameter {name} is not set")
                continue
            allowed = p.get("AllowedValues")
            if allowed and v not in [str(a) for a in allowed]:
                out.append(f"{name}={v} is not one of {allowed}")
            pattern = p.get("AllowedPattern")
            if pattern and not re.fullmatch(pattern, v):
                out.append(f"{name}={v} does not match {pattern}")
        return out

    def rule_findings(self):
        out = []
        for name, rule in self.template.get("Rules", {}).items():
            if "RuleCondition" in rule and not self.value(rule["RuleCondition"]):
                continue
            for a in rule.get("Assertions", []):
                if not self.value(a["Assert"]):
                    out.append(f"rule {name}: {a.get('AssertDescription', '')}")
        return out

    def condition(self, name):
        if name not in self.conditions:
            self.conditions[name] = bool(self.value(self.template["Conditions"][name]))
        return self.conditions[name]

    def ref(self, name):
        if name == "AWS::NoValue":
            return NO_VALUE
        if name in PSEUDO:
            return PSEUDO[name]
        if name in self.params:
            if self.template["Parameters"][name]["Type"] == "CommaDelimitedList":
                return [s.strip() for s in self.params[name].split(",")]
            return self.params[name]
        if name in self.template["Resources"]:
            return f"<{name}>"
        raise KeyError(f"Ref to unknown {name}")

    def sub(self, text, extra):
        def one(m):
            key = m.group(1)
            if key in extra:
                return str(extra[key])
            if "." in key:
                return f"<{key}>"
            return str(self.ref(key))

        return re.sub(r"\$\{([^}!][^}]*)\}", one, text)

    def value(self, x):
        if isinstance(x, dict) and len(x) == 1:
            (key, arg), = x.items()
            if key == "Ref":
                return self.ref(arg)
            if key == "Fn::GetAtt":
                res, att = arg if isinstance(arg, list) else arg.split(".", 1)
                return f"<{res}.{att}>"
            if key == "Fn::If":
                cond, yes, no = arg
                taken, other = (yes, no) if self.condition(cond) else (no, yes)
                if self.strict:
                    self.value(other)
                return self.value(taken)
            if key == "Fn::Sub":
                if isinstance(arg, list):
                    return self.sub(arg[0], {k: self.value(v) for k, v in arg[1].items()})
                return self.sub(arg, {})
            if key == "Fn::Select":
                index, items = arg
                items = self.value(items)
                return items[int(self.value(index))]
            if key == "Fn::Split":
                delimiter, text = arg
                return self.value(text).split(delimiter)
            if key == "Fn::Join":
                delimiter, items = arg
                return delimiter.join(str(i) for i in self.value(items))
            if key == "Condition":
                return self.condition(arg)
            if key == "Fn::Equals":
                return self.value(arg[0]) == self.value(arg[1])
            if key == "Fn::Not":
                return not self.value(arg[0])
            if key == "Fn::And":
                return all(self.value(c) for c in arg)
            if key == "Fn::Or":
                return any(self.value(c) for c in arg)
            if key.startswith("Fn::"):
                raise NotImplementedError(f"{key} is not rendered by tests/py/test_template.py")
        if isinstance(x, dict):
            out = {k: self.value(v) for k, v in x.items()}
            return {k: v for k, v in out.items() if v is not NO_VALUE}
        if isinstance(x, list):
            return [v for v in (self.value(i) for i in x) if v is not NO_VALUE]
        return x

    def resources(self, kind):
        """(logical id, rendered properties) of the resources of `kind` that are created."""
        for name, r in self.template["Resources"].items():
            if r.get("Type") == kind and ("Condition" not in r or self.condition(r["Condition"])):
                yield name, self.value(r.get("Properties") or {})

    def kafka_mappings(self):
        return {
            name: props
            for name, props in self.resources("AWS::Lambda::EventSourceMapping")
            if props.get("FunctionName") == "<IngestFunction>" and "Topics" in props
        }

    def ingest_statements(self):
        policies = self.value(self.template["Resources"]["IngestFunction"]["Properties"]["Policies"])
        return [st for pol in policies for st in pol.get("Statement", [])]


MSK_ARN = "arn:aws:kafka:us-east-1:111122223333:cluster/test-cluster/11111111-2222-3333-4444-555555555555-1"
KAFKA_SECRET = "arn:aws:secretsmanager:us-east-1:111122223333:secret:streamtable/kafka-AbCdEf"
ROOT_CA_SECRET = "arn:aws:secretsmanager:us-east-1:111122223333:secret:streamtable/kafka-ca-GhIjKl"
SECRETS_KEY = "arn:aws:kms:us-east-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"
BOOTSTRAP = "b-1.kafka.example.com:9096,b-2.kafka.example.com:9096"
KAFKA_AUTHS = ["BASIC_AUTH", "SASL_SCRAM_256_AUTH", "SASL_SCRAM_512_AUTH", "CLIENT_CERTIFICATE_TLS_AUTH"]
# The three tables' mappings: logical id of the MSK one (SAM's for its former MSK events, kept
# so that deployed stacks update their mappings in place), topic parameter, consumer group.
KAFKA_TABLES = [
    ("IngestFunctionOrders", "OrdersTopic", "orders"),
    ("IngestFunctionPayments", "PaymentsTopic", "payments"),
    ("IngestFunctionReadings", "ReadingsTopic", "readings"),
    ("IngestFunctionOrderStatus", "OrderStatusTopic", "order-status"),
]
MSK_ONLY = {"EventSourceArn", "AmazonManagedKafkaEventSourceConfig"}
SELF_MANAGED_ONLY = {"SelfManagedEventSource", "SelfManagedKafkaEventSourceConfig", "SourceAccessConfigurations"}
MSK_SIDS = {"MskCluster", "MskConnect", "MskTopics", "MskConsumerGroups"}
EC2_SIDS = {"NetworkInterfacesDescribe", "NetworkInterfacesManage"}


def subnets(n):
    return ",".join(f"subnet-{i:017x}" for i in range(1, n + 1))


def security_groups(n):
    return ",".join(f"sg-{i:017x}" for i in range(1, n + 1))


def self_managed(auth, **extra):
    params = {"KafkaSource": "SelfManaged", "KafkaBootstrapServers": BOOTSTRAP, "KafkaAuthentication": auth}
    if auth != "NONE":
        params["KafkaSecretArn"] = KAFKA_SECRET
    params.update(extra)
    return params


def vpc_access(n_subnets, n_groups):
    return [("VPC_SUBNET", f"subnet:subnet-{i:017x}") for i in range(1, n_subnets + 1)] + [
        ("VPC_SECURITY_GROUP", f"security_group:sg-{i:017x}") for i in range(1, n_groups + 1)
    ]


# (what, parameters, expected SourceAccessConfigurations (None: an MSK mapping), whether the
# role may use the secrets key, whether it may manage network interfaces)
KAFKA_SCENARIOS = [
    ("MSK", {"MskClusterArn": MSK_ARN}, None, False, True),
    *[
        (f"self-managed {auth}", self_managed(auth), [(auth, KAFKA_SECRET)], False, False)
        for auth in KAFKA_AUTHS
    ],
    (
        "self-managed NONE inside a VPC, private root CA, secrets key",
        self_managed(
            "NONE",
            KafkaRootCaSecretArn=ROOT_CA_SECRET,
            KafkaSecretsKmsKeyArn=SECRETS_KEY,
            KafkaSubnetIds=subnets(3),
            KafkaSecurityGroupIds=security_groups(2),
        ),
        [("SERVER_ROOT_CA_CERTIFICATE", ROOT_CA_SECRET)] + vpc_access(3, 2),
        True,
        True,
    ),
    (
        "self-managed mTLS inside a VPC, 6 subnets, 5 security groups, private root CA",
        self_managed(
            "CLIENT_CERTIFICATE_TLS_AUTH",
            KafkaRootCaSecretArn=ROOT_CA_SECRET,
            KafkaSubnetIds=subnets(6),
            KafkaSecurityGroupIds=security_groups(5),
        ),
        [("CLIENT_CERTIFICATE_TLS_AUTH", KAFKA_SECRET), ("SERVER_ROOT_CA_CERTIFICATE", ROOT_CA_SECRET)]
        + vpc_access(6, 5),
        False,
        True,
    ),
    # Every number of subnets and security groups the parameters allow.
    *[
        (
            f"self-managed SCRAM inside a VPC, {n} subnets, {g} security groups",
            self_managed("SASL_SCRAM_256_AUTH", KafkaSubnetIds=subnets(n), KafkaSecurityGroupIds=security_groups(g)),
            [("SASL_SCRAM_256_AUTH", KAFKA_SECRET)] + vpc_access(n, g),
            False,
            True,
        )
        for n in range(1, 7)
        for g in range(1, 6)
    ],
    (
        "self-managed SCRAM, the ingest function in a VPC",
        self_managed("SASL_SCRAM_512_AUTH", SubnetIds="subnet-0aaa", SecurityGroupIds="sg-0aaa"),
        [("SASL_SCRAM_512_AUTH", KAFKA_SECRET)],
        False,
        True,
    ),
]

# Choices the template must refuse before it creates anything: (what, parameters, a word of the
# refusal).
KAFKA_REFUSED = [
    ("MSK without MskClusterArn", {}, "MskClusterGiven"),
    ("self-managed without KafkaBootstrapServers", self_managed("SASL_SCRAM_512_AUTH", KafkaBootstrapServers=""), "SelfManagedKafkaReachable"),
    ("an authentication without KafkaSecretArn", self_managed("BASIC_AUTH", KafkaSecretArn=""), "SelfManagedKafkaSecret"),
    ("no authentication outside a VPC", self_managed("NONE"), "SelfManagedKafkaReachable"),
    ("subnets without security groups", self_managed("NONE", KafkaSubnetIds=subnets(2)), "SelfManagedKafkaReachable"),
    ("7 subnets", self_managed("NONE", KafkaSubnetIds=subnets(7), KafkaSecurityGroupIds=security_groups(1)), "KafkaSubnetIds"),
    ("6 security groups", self_managed("NONE", KafkaSubnetIds=subnets(1), KafkaSecurityGroupIds=security_groups(6)), "KafkaSecurityGroupIds"),
    ("a space in KafkaBootstrapServers", self_managed("BASIC_AUTH", KafkaBootstrapServers="a.example.com:9092, b.example.com:9092"), "KafkaBootstrapServers"),
    ("a secret ARN without its suffix", self_managed("BASIC_AUTH", KafkaSecretArn=KAFKA_SECRET[:-7]), "KafkaSecretArn"),
    ("an unknown authentication", self_managed("SASL_PLAIN"), "KafkaAuthentication"),
]


def granted(statements, action):
    """Resources an Allow statement grants `action` on."""
    return {
        r
        for st in statements
        if st.get("Effect") == "Allow" and action in as_list(st.get("Action", []))
        for r in as_list(st.get("Resource", []))
    }


def kafka_source_findings(template):
    """Both Kafka sources render valid, mutually exclusive mappings; each authentication maps to
    its SourceAccessConfigurations; the ingest role may read exactly the secrets the mappings
    name, and holds MSK's permissions only for MSK."""
    out = []
    resources = template["Resources"]

    # Which family each mapping belongs to, by its condition; the two conditions exclude each
    # other whatever the parameters.
    for name, props in kafka_mappings(template):
        want = "FromSelfManagedKafka" if "SelfManagedEventSource" in props else "FromMsk"
        if resources[name].get("Condition") != want:
            out.append(f"{name}: Condition {resources[name].get('Condition')!r}, not {want}")
    for source in ("MSK", "SelfManaged", "Kinesis"):
        for arn in ("", MSK_ARN):
            for servers in ("", BOOTSTRAP):
                r = Render(template, {"KafkaSource": source, "MskClusterArn": arn, "KafkaBootstrapServers": servers}, strict=False)
                both = r.condition("FromMsk") and r.condition("FromSelfManagedKafka")
                if both:
                    out.append(f"KafkaSource={source}: FromMsk and FromSelfManagedKafka both hold")

    # The two families share every setting but the source's own.
    msk = {name: props for name, props in kafka_mappings(template) if "SelfManagedEventSource" not in props}
    smk = {name: props for name, props in kafka_mappings(template) if "SelfManagedEventSource" in props}
    for m, s in zip(sorted(msk), sorted(smk)):
        if set(msk[m]) - MSK_ONLY != set(smk[s]) - SELF_MANAGED_ONLY:
            out.append(f"{m} and {s} differ in {sorted((set(msk[m]) - MSK_ONLY) ^ (set(smk[s]) - SELF_MANAGED_ONLY))}")

    for what, params, access, kms, ec2 in KAFKA_SCENARIOS:
        r = Render(template, params)
        try:
            problems = r.parameter_findings() + r.rule_findings()
            mappings = r.kafka_mappings()
            statements = r.ingest_statements()
        except (IndexError, KeyError, NotImplementedError) as e:
            out.append(f"{what}: the template does not render: {e!r}")
            continue
        out += [f"{what}: {p}" for p in problems]
        is_msk = access is None
        want_names = {n if is_msk else n + "SelfManaged" for n, _, _ in KAFKA_TABLES}
        if set(mappings) != want_names:
            out.append(f"{what}: mappings {sorted(mappings)}, want {sorted(want_names)}")
            continue
        for name, param, group in KAFKA_TABLES:
            m = mappings[name if is_msk else name + "SelfManaged"]
            topic = template["Parameters"][param]["Default"]
            if m.get("Topics") != [topic]:
                out.append(f"{what}: {name} reads {m.get('Topics')}, not [{topic!r}]")
            config = m.get("AmazonManagedKafkaEventSourceConfig" if is_msk else "SelfManagedKafkaEventSourceConfig", {})
            if config.get("ConsumerGroupId") != f"{PSEUDO['AWS::StackName']}-{group}":
                out.append(f"{what}: {name}'s consumer group is {config.get('ConsumerGroupId')!r}")
            if set(m) & (SELF_MANAGED_ONLY if is_msk else MSK_ONLY):
                out.append(f"{what}: {name} mixes MSK and self-managed properties: {sorted(m)}")
            if is_msk:
                if m.get("EventSourceArn") != MSK_ARN:
                    out.append(f"{what}: {name} reads {m.get('EventSourceArn')!r}")
                continue
            servers = m.get("SelfManagedEventSource", {}).get("Endpoints", {}).get("KafkaBootstrapServers")
            if servers != BOOTSTRAP.split(","):
                out.append(f"{what}: {name} bootstraps from {servers!r}")
            got = sorted((c.get("Type"), c.get("URI")) for c in m.get("SourceAccessConfigurations", []))
            if got != sorted(access):
                out.append(f"{what}: {name}'s SourceAccessConfigurations are {got}, want {sorted(access)}")
        # The role: the secrets the mappings name, and nothing of the other source.
        secrets = {
            c["URI"]
            for m in mappings.values()
            for c in m.get("SourceAccessConfigurations", [])
            if not c["Type"].startswith("VPC_")
        }
        if granted(statements, "secretsmanager:GetSecretValue") != secrets:
            out.append(
                f"{what}: the ingest role may read secrets {sorted(granted(statements, 'secretsmanager:GetSecretValue'))}, "
                f"the mappings need {sorted(secrets)}"
            )
        if bool(granted(statements, "kms:Decrypt")) != kms or (kms and granted(statements, "kms:Decrypt") != {SECRETS_KEY}):
            out.append(f"{what}: kms:Decrypt on {sorted(granted(statements, 'kms:Decrypt'))}")
        sids = {st.get("Sid") for st in statements}
        if (MSK_SIDS <= sids) != is_msk or (not is_msk and sids & MSK_SIDS):
            out.append(f"{what}: MSK permissions {sorted(sids & MSK_SIDS)}")
        if (EC2_SIDS <= sids) != ec2 or (not ec2 and sids & EC2_SIDS):
            out.append(f"{what}: network interface permissions {sorted(sids & EC2_SIDS)}, want {'both' if ec2 else 'none'}")

    # Both sources: the same topic, consumer group, starting position, batch size and window,
    # metrics and on-failure destination, from the parameters.
    for policy in ("s3-after-retries", "retry-until-fixed"):
        shared = {"FailedBatchPolicy": policy, "StartingPosition": "LATEST", "BatchSize": "500", "MaximumBatchingWindowInSeconds": "3"}
        try:
            a = Render(template, {**shared, "MskClusterArn": MSK_ARN}).kafka_mappings()
            b = Render(template, {**shared, **self_managed("SASL_SCRAM_512_AUTH")}).kafka_mappings()
        except (IndexError, KeyError, NotImplementedError) as e:
            out.append(f"FailedBatchPolicy={policy}: the template does not render: {e!r}")
            continue
        for name, _, _ in KAFKA_TABLES:
            m, s = a.get(name, {}), b.get(name + "SelfManaged", {})
            for key in sorted((set(m) - MSK_ONLY) | (set(s) - SELF_MANAGED_ONLY)):
                if m.get(key) != s.get(key):
                    out.append(f"FailedBatchPolicy={policy}: {name} {key} is {m.get(key)!r} from MSK, {s.get(key)!r} self-managed")
            if (m.get("AmazonManagedKafkaEventSourceConfig") or {}).get("ConsumerGroupId") != (
                s.get("SelfManagedKafkaEventSourceConfig") or {}
            ).get("ConsumerGroupId"):
                out.append(f"{name}: the two sources use different consumer groups")
            if (m.get("StartingPosition"), m.get("BatchSize"), m.get("MaximumBatchingWindowInSeconds")) != ("LATEST", "500", "3"):
                out.append(f"{name}: starting position, batch size or window do not follow the parameters")
            if ("DestinationConfig" in m) != (policy == "s3-after-retries"):
                out.append(f"FailedBatchPolicy={policy}: {name} DestinationConfig is {m.get('DestinationConfig')!r}")

    for what, params, word in KAFKA_REFUSED:
        r = Render(template, {"MskClusterArn": MSK_ARN, **params} if params.get("KafkaSource") else params)
        try:
            problems = r.parameter_findings() + r.rule_findings()
        except (IndexError, KeyError, NotImplementedError) as e:
            problems = [repr(e)]
        if not any(word in p for p in problems):
            out.append(f"{what}: not refused (want a refusal naming {word}; got {problems})")
    return out


def readme_example_findings(template):
    """The `sam deploy --parameter-overrides` examples of README "Self-managed Kafka" pass the
    template's parameter constraints and Rules, and render self-managed mappings."""
    import shlex

    text = (ROOT / "README.md").read_text()
    if "### Self-managed Kafka" not in text:
        return ['README.md has no "Self-managed Kafka" section']
    section = text.split("### Self-managed Kafka", 1)[1].split("\n### ", 1)[0]
    out, examples = [], 0
    for block in re.findall(r"```sh\n(.*?)```", section, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if "sam deploy" not in line or "--parameter-overrides" not in line:
                continue
            examples += 1
            words = shlex.split(line.split(" #", 1)[0])
            params = dict(w.split("=", 1) for w in words[words.index("--parameter-overrides") + 1 :])
            r = Render(template, params)
            out += [f"README example {params.get('KafkaAuthentication')}: {f}" for f in r.parameter_findings() + r.rule_findings()]
            if not any(n.endswith("SelfManaged") for n in r.kafka_mappings()):
                out.append(f"README example {params.get('KafkaAuthentication')}: no self-managed mappings")
    if examples < 3:
        out.append(f"README's Self-managed Kafka section has {examples} sam deploy examples, want 3")
    return out


def sam_transform_findings(template):
    """The SAM transform, which CloudFormation runs on deploy (cfn-lint and `sam validate --lint`
    do not), accepts the template and keeps the Kafka mappings' logical ids."""
    import json
    import os

    try:
        from samtranslator.public.exceptions import InvalidDocumentException
        from samtranslator.translator.transform import transform
    except ImportError:
        return ["samtranslator is missing (the SAM CLI of tests/requirements-deploy.txt brings it)"]

    class NoManagedPolicies:
        def load(self):
            return {}

    doc = json.loads(json.dumps(template))
    for r in doc["Resources"].values():
        if r.get("Type") == "AWS::Serverless::Function":
            r["Properties"]["CodeUri"] = "s3://bucket/code.zip"  # `sam deploy` uploads it
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    try:
        out = transform(doc, {}, NoManagedPolicies())
    except InvalidDocumentException as e:
        return [f"SAM transform: {c.message}" for c in e.causes]
    names = {n for n, r in out["Resources"].items() if r["Type"] == "AWS::Lambda::EventSourceMapping"}
    want = {n + s for n, _, _ in KAFKA_TABLES for s in ("", "SelfManaged")}
    return [f"SAM transform: no mappings {sorted(want - names)}"] if want - names else []


def samconfig_findings(template):
    """samconfig.toml: each environment deploys with the capabilities the template needs and
    parameters the template has, every required parameter set and every Rule passed."""
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
        # The template's Rules (e.g. MskClusterArn with KafkaSource=MSK, the default).
        rendered = Render(template, dict(o.split("=", 1) for o in as_list(overrides)))
        out += [f"samconfig.toml [{e}]: {f}" for f in rendered.rule_findings()]
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
        + kafka_source_findings(template)
        + readme_example_findings(template)
        + sam_transform_findings(template)
    )
    for f in findings:
        print("FAIL", f)
    if not findings:
        print(
            "template.yaml: IAM statements name their resources; alarms can publish; failed batches "
            "go to S3; ingest is scoped; dashboards match infra/dashboards; logs, traces and "
            "metrics are scoped to the stack; samconfig.toml deploys every environment; MSK and "
            "self-managed Kafka render exclusive mappings with the right access and IAM; the SAM "
            "transform accepts the template"
        )
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
