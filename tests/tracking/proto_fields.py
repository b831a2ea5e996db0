"""accel's tensorboard.proto against the tensorboard package's own descriptors (*_pb2.py): every
message and enum accel declares exists there under the same name, and every field has the same
number, type, label (repeated or not), packing and oneof; every enum value the same number.

usage: proto_fields.py DESCRIPTOR_SET   (protoc --descriptor_set_out of src/tracking/tensorboard.proto)
"""
import sys

from google.protobuf import descriptor_pb2
from tensorboard.compat.proto import event_pb2, histogram_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2

theirs_files = [event_pb2, histogram_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2]
theirs_msgs, theirs_enums = {}, {}
for mod in theirs_files:
    fd = mod.DESCRIPTOR
    def walk(m):
        theirs_msgs[m.full_name.replace("tensorboard.", "", 1)] = m
        for n in m.nested_types:
            walk(n)
        for e in m.enum_types:
            theirs_enums[e.full_name.replace("tensorboard.", "", 1)] = e
    for m in fd.message_types_by_name.values():
        walk(m)
    for e in fd.enum_types_by_name.values():
        theirs_enums[e.full_name.replace("tensorboard.", "", 1)] = e

fds = descriptor_pb2.FileDescriptorSet()
fds.ParseFromString(open(sys.argv[1], "rb").read())
ours = fds.file[0]
prefix = "." + ours.package + "."
failures, fields = [], 0


def packed(field_desc_proto, syntax):
    if field_desc_proto.options.HasField("packed"):
        return field_desc_proto.options.packed
    scalar = field_desc_proto.type not in (9, 11, 12)  # string, message, bytes
    return syntax == "proto3" and field_desc_proto.label == 3 and scalar


def check_msg(m, name):
    global fields
    t = theirs_msgs.get(name)
    if t is None:
        failures.append(f"message {name}: not in tensorboard")
        return
    for f in m.field:
        tf = t.fields_by_name.get(f.name)
        fields += 1
        if tf is None:
            failures.append(f"{name}.{f.name}: not in tensorboard")
            continue
        ours_type = f.type_name.replace(prefix, "") if f.type_name else f.type
        their_type = (tf.message_type.full_name.replace("tensorboard.", "", 1) if tf.message_type else
                      tf.enum_type.full_name.replace("tensorboard.", "", 1) if tf.enum_type else tf.type)
        their_oneof = tf.containing_oneof.name if tf.containing_oneof else None
        our_oneof = m.oneof_decl[f.oneof_index].name if f.HasField("oneof_index") else None
        their_packed = tf.is_packed if hasattr(tf, "is_packed") else None
        checks = [("number", f.number, tf.number), ("type", ours_type, their_type),
                  ("repeated", f.label == 3, tf.is_repeated if hasattr(tf, "is_repeated") else tf.label == 3),
                  ("oneof", our_oneof, their_oneof)]
        if their_packed is not None:
            checks.append(("packed", packed(f, ours.syntax or "proto2"), their_packed))
        for what, a, b in checks:
            if a != b:
                failures.append(f"{name}.{f.name}: {what} {a} here, {b} in tensorboard")
    for n in m.nested_type:
        check_msg(n, name + "." + n.name)
    for e in m.enum_type:
        check_enum(e, name + "." + e.name)


def check_enum(e, name):
    t = theirs_enums.get(name)
    if t is None:
        failures.append(f"enum {name}: not in tensorboard")
        return
    for v in e.value:
        tv = t.values_by_name.get(v.name)
        if tv is None or tv.number != v.number:
            failures.append(f"{name}.{v.name} = {v.number}: tensorboard has {tv.number if tv else 'none'}")


for m in ours.message_type:
    check_msg(m, m.name)
for e in ours.enum_type:
    check_enum(e, e.name)
if failures:
    print("FAIL\n  " + "\n  ".join(failures))
    sys.exit(1)
print(f"tensorboard.proto: {len(ours.message_type)} messages, {fields} fields, numbers/types/labels/oneofs/packing "
      "equal to the tensorboard package's")
