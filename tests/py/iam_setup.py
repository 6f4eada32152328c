"""Sets up a moto server that enforces IAM for tests/moto/iam.rs: one IAM user per function of
template.yaml, each carrying only that function's policy, so that a function's scenarios fail
on a permission the template forgot.

Usage: python tests/py/iam_setup.py ENDPOINT NAME
Prints JSON: {"admin": {"key", "secret"}, "functions": {"IngestFunction": {"key", "secret"}, …}}

Moto checks IAM once `INITIAL_NO_AUTH_ACTION_COUNT` requests were made without it; this script
sets that count to the three requests that create an administrator (POST /moto-api/reset-auth),
then does everything else as that administrator: the bucket, the state table (with a stream),
a Glue Schema Registry subject `NAME/orders-value`, and the functions' users. The policies are the template's statements with every intrinsic
resolved for this bucket, table and database, and two adaptations to what moto can evaluate:

- moto computes a request's resource ARN for S3 only (its other services ask about "*"), so
  the S3 statements keep their resources (prefixes are checked) and the others are granted on
  "*" (their actions are still checked);
- moto names a DynamoDB transaction's action after the call (`TransactWriteItems`,
  `TransactGetItems`), where AWS checks the item actions it carries: a statement granting those
  item actions also grants the call's name. Conditions (`dynamodb:LeadingKeys`, `s3:prefix`) are
  not evaluated by moto and are left out.
"""

import json
import pathlib
import re
import sys
import urllib.request

import boto3
from cfnlint.decode import decode_str

ROOT = pathlib.Path(__file__).resolve().parents[2]
ACCOUNT = "123456789012"
REGION = "us-east-1"
FUNCTIONS = ["IngestFunction", "ScheduledFunction", "CommitTriggerFunction"]


def resolver(name):
    """Resolves the template's intrinsics for a stack whose bucket, state table and Glue
    database are all `name` (underscores in the database)."""
    database = name.replace("-", "_")
    refs = {
        "AWS::Partition": "aws",
        "AWS::Region": REGION,
        "AWS::AccountId": ACCOUNT,
        "AWS::StackName": name,
        "DataBucket": name,
        "ExistingDataBucket": name,
        "StateTable": name,
        "ExistingStateTable": name,
        "GlueDatabaseName": database,
        "MskClusterArn": f"arn:aws:kafka:{REGION}:{ACCOUNT}:cluster/test/0",
        "OrdersTopic": "orders",
        "PaymentsTopic": "payments",
        "ReadingsTopic": "readings",
        "OrderStatusTopic": "order_status",
    }
    attrs = {
        ("StateTable", "Arn"): f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{name}",
        ("StateTable", "StreamArn"): f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{name}/stream/x",
        ("DataBucket", "Arn"): f"arn:aws:s3:::{name}",
        ("FailedBatchBucket", "Arn"): f"arn:aws:s3:::{name}-failed",
    }
    # The default deployment (KafkaSource=MSK, so the MSK mappings' network interfaces too); any
    # other condition is false.
    conditions = {"CreatesDataBucket": True, "CreatesStateTable": True, "FromMsk": True, "NeedsNetworkInterfaces": True}

    def attr(res, a):
        return attrs.get((res, a), f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{res}")

    def sub(text, extra):
        def one(m):
            key = m.group(1)
            if key in extra:
                return str(extra[key])
            if "." in key:
                return attr(*key.split(".", 1))
            return str(refs.get(key, key))

        return re.sub(r"\$\{([^}]+)\}", one, text)

    def resolve(v):
        if isinstance(v, dict):
            if "Ref" in v:
                return refs.get(v["Ref"], v["Ref"])
            if "Fn::Sub" in v:
                s = v["Fn::Sub"]
                if isinstance(s, list):
                    return sub(s[0], {k: resolve(x) for k, x in s[1].items()})
                return sub(s, {})
            if "Fn::GetAtt" in v:
                a = v["Fn::GetAtt"]
                res, at = a if isinstance(a, list) else a.split(".", 1)
                return attr(res, at)
            if "Fn::If" in v:
                cond, yes, no = v["Fn::If"]
                return resolve(yes if conditions.get(cond, False) else no)
            return {k: resolve(x) for k, x in v.items()}
        if isinstance(v, list):
            return [resolve(x) for x in v]
        return v

    return resolve


TRANSACTIONS = {
    "dynamodb:TransactWriteItems": {
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "dynamodb:DeleteItem",
        "dynamodb:ConditionCheckItem",
    },
    "dynamodb:TransactGetItems": {"dynamodb:GetItem"},
}


def for_moto(statement):
    actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
    out = {"Effect": statement["Effect"], "Action": list(actions)}
    for call, items in TRANSACTIONS.items():
        if items & set(actions):
            out["Action"].append(call)
    if all(a.startswith("s3:") for a in actions):
        out["Resource"] = statement["Resource"]
    else:
        out["Resource"] = "*"
    return out


def policies(name):
    template = decode_str((ROOT / "template.yaml").read_text())[0]
    resolve = resolver(name)
    out = {}
    for fn in FUNCTIONS:
        statements = []
        for policy in template["Resources"][fn]["Properties"]["Policies"]:
            for st in policy["Statement"]:
                st = resolve(st)
                if isinstance(st, str) or st is None:
                    continue  # an !If branch with AWS::NoValue
                statements.append(for_moto(st))
        out[fn] = {"Version": "2012-10-17", "Statement": statements}
    return out


def main():
    endpoint, name = sys.argv[1], sys.argv[2]
    req = urllib.request.Request(
        f"{endpoint}/moto-api/reset-auth", data=b"3", method="POST", headers={"Content-Type": "text/plain"}
    )
    urllib.request.urlopen(req).read()
    base = dict(endpoint_url=endpoint, region_name=REGION)
    iam = boto3.client("iam", aws_access_key_id="x", aws_secret_access_key="x", **base)
    iam.create_user(UserName=f"{name}-admin")
    iam.put_user_policy(
        UserName=f"{name}-admin",
        PolicyName="admin",
        PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        ),
    )
    key = iam.create_access_key(UserName=f"{name}-admin")["AccessKey"]
    admin = dict(aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"], **base)
    boto3.client("s3", **admin).create_bucket(Bucket=name)
    boto3.client("dynamodb", **admin).create_table(
        TableName=name,
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        BillingMode="PAY_PER_REQUEST",
        StreamSpecification={"StreamEnabled": True, "StreamViewType": "KEYS_ONLY"},
    )
    # A Glue Schema Registry subject for a table whose columns come from the registry.
    glue = boto3.client("glue", **admin)
    glue.create_registry(RegistryName=name)
    glue.create_schema(
        RegistryId={"RegistryName": name},
        SchemaName="orders-value",
        DataFormat="AVRO",
        Compatibility="NONE",
        SchemaDefinition=json.dumps(
            {
                "type": "record",
                "name": "Order",
                "fields": [
                    {"name": "order_id", "type": "string"},
                    {"name": "amount", "type": "string"},
                    {"name": "created_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
                ],
            }
        ),
    )
    iam = boto3.client("iam", **admin)
    result = {"admin": {"key": key["AccessKeyId"], "secret": key["SecretAccessKey"]}, "functions": {}}
    for fn, doc in policies(name).items():
        user = f"{name}-{fn}"
        iam.create_user(UserName=user)
        iam.put_user_policy(UserName=user, PolicyName=fn, PolicyDocument=json.dumps(doc))
        k = iam.create_access_key(UserName=user)["AccessKey"]
        result["functions"][fn] = {"key": k["AccessKeyId"], "secret": k["SecretAccessKey"]}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
