"""The seed's mul (blog post 004): mul_output = mul_input0 * mul_input1, element-wise."""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        model_config = json.loads(args["model_config"])
        mul_output_config = pb_utils.get_output_config_by_name(model_config, "mul_output")
        self.mul_output_dtype = pb_utils.triton_string_to_numpy(mul_output_config["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "mul_input0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "mul_input1")
            out = in_0.as_numpy() * in_1.as_numpy()
            out_tensor = pb_utils.Tensor("mul_output", out.astype(self.mul_output_dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out_tensor]))
        return responses
