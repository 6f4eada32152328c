"""Checks template.yaml beyond what cfn-lint checks.

- IAM least privilege: no wildcard in any action; no "*" resource except for actions that
  support no resource-level permissions (EC2 Describe calls).
- The dashboards have one source of truth: every Athena named query and QuickSight dataset SQL
  equals a file of infra/dashboards, and every dataset declares exactly the query's columns.

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


def main():
    template, matches = decode_str((ROOT / "template.yaml").read_text())
    if matches:
        print("template.yaml does not parse:", matches)
        return 1
    findings = iam_findings(template) + dashboard_findings(template)
    for f in findings:
        print("FAIL", f)
    if not findings:
        print("template.yaml: IAM statements name their resources; dashboards match infra/dashboards")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
