"""The seed's add_sub (blog post 004): added_output = a + b, subbed_output = a - b, written the
way a Triton python-backend user writes it."""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        model_config = json.loads(args["model_config"])
        added_output_config = pb_utils.get_output_config_by_name(model_config, "added_output")
        subbed_output_config = pb_utils.get_output_config_by_name(model_config, "subbed_output")
        self.added_output_dtype = pb_utils.triton_string_to_numpy(added_output_config["data_type"])
        self.subbed_output_dtype = pb_utils.triton_string_to_numpy(
            subbed_output_config["data_type"]
        )

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "add_sub_input0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "add_sub_input1")
            out_0, out_1 = (in_0.as_numpy() + in_1.as_numpy(), in_0.as_numpy() - in_1.as_numpy())
            out_tensor_0 = pb_utils.Tensor("added_output", out_0.astype(self.added_output_dtype))
            out_tensor_1 = pb_utils.Tensor("subbed_output", out_1.astype(self.subbed_output_dtype))
            response = pb_utils.InferenceResponse(output_tensors=[out_tensor_0, out_tensor_1])
            responses.append(response)
        return responses
